#!/bin/sh
# Lists the .c files of the given folders (not recursive), sorted, one a line, for meson.build.
cd "${MESON_SOURCE_ROOT:-.}" || exit 1
for d in "$@"; do
        [ -d "$d" ] && find "$d" -maxdepth 1 -name '*.c' -type f
done | LC_ALL=C sort
