#!/usr/bin/env bash
# The installed C++ package, as another project uses it:
#   bash tests/integration/cpp_package.sh PATH/TO/paged    (PAGED_BINARY_DIR: the build folder to install from)
# `cmake --install` of the build into a scratch prefix (it copies, builds nothing); the installed public headers
# include no CAF, Boost or CUDA header; examples/offline (the README's example) built against the prefix twice, with
# find_package(paged) and with pkg-config alone, and each run on the in-repo stories260K: its 32 greedy ids are the
# first 32 of the Hugging Face golden ids, and its text a prefix of the golden text.
set -u

NAME=cpp_package
. "$(dirname "$0")/worker_common.bash" "$@"
BUILD=${PAGED_BINARY_DIR:?$NAME: PAGED_BINARY_DIR names the build folder}
command -v pkg-config >/dev/null || { echo "$NAME: pkg-config is required (tools/setup.sh installs it)" >&2; exit 1; }
PREFIX=$TMP/prefix
EXAMPLE=$SRC/examples/offline

cmake --install "$BUILD" --prefix "$PREFIX" >"$TMP/install.log" 2>&1 || fail "install: $(tail -n 5 "$TMP/install.log")"
[ -f "$PREFIX/include/paged/actors/engine.h" ] || fail "no include/paged/actors/engine.h in $(ls -R "$PREFIX")"
leaks=$(grep -rlE '#include *[<"](caf/|boost/|cuda|cublas|nccl)' "$PREFIX/include")
[ -z "$leaks" ] || fail "public headers that include CAF, Boost or CUDA: $leaks"

# check_run LABEL EXE: EXE run from the checkout's root prints the golden ids, then a prefix of the golden text.
golden_ids=$(node -e 'const g = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
  process.stdout.write(g.cases[0].greedy_ids.slice(0, 32).join(" "))' "$GOLDEN")
check_run() {
  (cd "$SRC" && "$2") >"$TMP/$1.out" 2>"$TMP/$1.err" || { fail "$1: exit $? $(tail -n 3 "$TMP/$1.err")"; return; }
  local ids text
  ids=$(head -n 1 "$TMP/$1.out" | sed 's/ *$//')
  text=$(tail -n +2 "$TMP/$1.out")
  [ "$ids" = "$golden_ids" ] || fail "$1: ids '$ids', golden '$golden_ids'"
  node -e 'const g = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
    process.exit(process.argv[2].length > 40 && g.cases[0].greedy_text.startsWith(process.argv[2]) ? 0 : 1)' \
    "$GOLDEN" "$text" || fail "$1: the text '$text' does not begin the golden text"
}

# find_package(paged): a CMake project of its own.
if cmake -S "$EXAMPLE" -B "$TMP/cmake" -DCMAKE_PREFIX_PATH="$PREFIX" -DCMAKE_BUILD_TYPE=Release \
  >"$TMP/cmake.log" 2>&1 && cmake --build "$TMP/cmake" >>"$TMP/cmake.log" 2>&1; then
  check_run cmake "$TMP/cmake/offline"
else
  fail "the find_package(paged) project: $(tail -n 15 "$TMP/cmake.log")"
fi

# pkg-config: one compiler line; the headers it reads (-MM: no system headers; -M: all) include no CAF, Boost, CUDA.
export PKG_CONFIG_PATH=$PREFIX/lib/pkgconfig
read -r -a cflags <<<"$(pkg-config --cflags paged)"
read -r -a libs <<<"$(pkg-config --libs paged)"
if c++ -std=c++20 -O1 "${cflags[@]}" "$EXAMPLE/offline.cpp" "${libs[@]}" -o "$TMP/pc_offline" >"$TMP/pc.log" 2>&1
then
  check_run pkg_config "$TMP/pc_offline"
else
  fail "the pkg-config build: $(tail -n 15 "$TMP/pc.log")"
fi
c++ -std=c++20 -M "${cflags[@]}" "$EXAMPLE/offline.cpp" >"$TMP/deps.txt" 2>&1 || fail "c++ -M: $(tail -n 3 "$TMP/deps.txt")"
grep -qF "/include/paged/model/types.h" "$TMP/deps.txt" || fail "-M lists no installed header: $(head "$TMP/deps.txt")"
tr ' ' '\n' <"$TMP/deps.txt" | grep -E '/(caf|boost)/|cuda|nccl' >"$TMP/leaks.txt" &&
  fail "the example reads CAF, Boost or CUDA headers: $(head -n 5 "$TMP/leaks.txt")"

finish
