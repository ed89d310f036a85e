#!/bin/sh
# One tool call end to end through the CLI on the demo model: the call every target must
# give, the same as natively (issue 36). NEEDLE_CLI is the CLI, or on a cross build the
# script that runs it under qemu-user / wine (tests/CMakeLists.txt).
#   tool_call.sh    exit 0: the expected call; 1: anything else
set -eu
want='"function_calls":[{"name":"set_timer","arguments":{"minutes":25}}]'
out=$("$NEEDLE_CLI" run "Set a timer for 25 minutes" | tr -d '\r')
case "$out" in
  *"$want"*) echo "ok: $want"; exit 0 ;;
esac
echo "FAIL: expected $want in: $out"
exit 1
