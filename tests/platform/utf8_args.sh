#!/bin/sh
# Non-ASCII command-line arguments reach the CLI intact (issue 36): the model and the tools
# file are named by paths outside any ANSI code page (CJK, German, Greek), and the call is
# the one every target gives. On Windows the C runtime's argv holds the arguments in the
# ANSI code page, where "模型" becomes "??" and the file is not found: needle.exe rebuilds
# argv from the wide command line (platform_utf8_args) and opens files by UTF-8 path
# (platform_fopen). NEEDLE_CLI is the CLI or the script that runs it under an emulator.
#   utf8_args.sh SOURCE_DIR     exit 0: the expected call; 1: anything else
set -eu
src=$1
dir="utf8-args-模型-ü"
rm -rf "$dir"
mkdir "$dir"
cp "$src/models/needle-demo.cact" "$dir/demo-日本-ß.cact"
cp "$src/models/needle-demo.tools.json" "$dir/tools-αβγ.json"
want='"function_calls":[{"name":"set_timer","arguments":{"minutes":25}}]'
out=$("$NEEDLE_CLI" run --weights "$dir/demo-日本-ß.cact" --tools "$dir/tools-αβγ.json" \
      "Set a timer for 25 minutes" | tr -d '\r') || true
rm -rf "$dir"
case "$out" in
  *"$want"*) echo "ok: $want"; exit 0 ;;
esac
echo "FAIL: expected $want in: $out"
exit 1
