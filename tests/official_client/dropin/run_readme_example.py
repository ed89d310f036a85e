"""The official package's README example (the first ```python block of the wheel's
METADATA, passed as argv[1]) run unchanged on our package: it must run to the end and print
the list of results its comment shows."""
import ast
import contextlib
import io
import re
import sys

text = open(sys.argv[1], encoding="utf-8").read()
example = re.search(r"```python\n(.*?)```", text, re.S).group(1)
assert "needle.Needle(tools=[get_weather])" in example, example
out = io.StringIO()
with contextlib.redirect_stdout(out):
    exec(compile(example, "official-readme", "exec"), {"__name__": "__main__"})
printed = out.getvalue().strip()
print("official README example printed:", printed)
results = ast.literal_eval(printed)
assert isinstance(results, list) and all(isinstance(r, dict) for r in results), printed
