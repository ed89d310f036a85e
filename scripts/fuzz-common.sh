# shellcheck shell=bash
# Shared by scripts/fuzz.sh and scripts/fuzz-campaign.sh (sourced, run from the repository
# root): the build of the libFuzzer targets, their seed directories and their options.

FUZZ_TARGETS=(cact schema regex json_canon chat export hub validation schema_diff openai train)
FUZZ_BUILD_DIR=${FUZZ_BUILD:-build-fuzz}

# fuzz_build [TARGET...]: clang, ASan + UBSan, the library instrumented for coverage.
fuzz_build() {
  command -v clang >/dev/null || { echo "fuzz: clang is needed (libFuzzer)" >&2; exit 1; }
  local targets=("$@")
  [ ${#targets[@]} -gt 0 ] || targets=("${FUZZ_TARGETS[@]/#/fuzz_}")
  cmake -S . -B "$FUZZ_BUILD_DIR" -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DNEEDLE_SANITIZE=ON -DNEEDLE_FUZZ=ON -DNEEDLE_WERROR=ON -DNEEDLE_CUDA=OFF \
    -DNEEDLE_BUILD_TESTS=OFF >/dev/null
  cmake --build "$FUZZ_BUILD_DIR" -j "${FUZZ_JOBS:-2}" --target "${targets[@]}" >/dev/null
}

# fuzz_seeds NAME: the seed directory of a target (cact: both generations; cact_v2 and
# cact_v3: one). The loader's seeds are the small fixture models, copied out of the tree.
fuzz_seeds() {
  local name=$1
  case $name in
    cact | cact_v2 | cact_v3)
      local d=$FUZZ_BUILD_DIR/seeds-$name
      mkdir -p "$d"
      if [ "$name" != cact_v3 ]; then
        cp -f tests/fixtures/tiny_cq2.cact tests/fixtures/tiny_ternary.cact \
          tests/fixtures/tinyb_cq2.cact "$d"/
      fi
      if [ "$name" != cact_v2 ]; then
        # Needle 3 (format/cact3.c): the smallest v3 fixtures
        cp -f tests/fixtures/v3/v3c.cact tests/fixtures/v3/v3c_rung2.cact "$d"/
      fi
      echo "$d"
      ;;
    train)
      # the training readers' seeds, each file behind its selector byte (fuzz_train.c):
      # 0 the fine-tuning data lines, 1 small .cact files of both generations, 2 and 3 the
      # gradient fixtures' Needle 3 and Needle 2 checkpoints
      local d=$FUZZ_BUILD_DIR/seeds-train i=0 line f
      mkdir -p "$d"
      while IFS= read -r line; do
        i=$((i + 1))
        { printf '\000'; printf '%s' "$line"; } >"$d/data-$i"
      done <tests/fixtures/finetune/data.jsonl
      for f in tests/fixtures/v3/v3c.cact tests/fixtures/tiny_cq2.cact; do
        { printf '\001'; cat "$f"; } >"$d/cact-$(basename "$f")"
      done
      { printf '\002'; cat tests/fixtures/grad_v3/g3b.params.safetensors; } >"$d/ckpt-g3b"
      { printf '\003'; cat tests/fixtures/grad_v2/g2b.params.safetensors; } >"$d/ckpt-g2b"
      echo "$d"
      ;;
    *) echo "tests/fuzz/corpus/$name" ;;
  esac
}

# fuzz_options TARGET: input size caps that keep each execution short.
fuzz_options() {
  case $1 in
    cact) echo "-max_len=400000 -rss_limit_mb=4096" ;;
    regex) echo "-max_len=256" ;;
    chat) echo "-max_len=2048" ;;
    export) echo "-max_len=16384" ;;
    train) echo "-max_len=120000" ;;
    schema_diff) echo "-max_len=512" ;;
    *) echo "-max_len=4096" ;;
  esac
}
