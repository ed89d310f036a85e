# Writes the playground page as a C array (cmake -DIN=index.html -DOUT=file.c -P embed.cmake),
# so the server binary carries it and needs no files at run time.
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" n)
math(EXPR bytes "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
file(WRITE "${OUT}" "/* generated from tools/serve/playground/index.html by embed.cmake */\n#include <stddef.h>\n"
  "const unsigned char serve_playground_html[] = {${body} 0};\n"
  "const size_t serve_playground_html_len = ${bytes};\n")
