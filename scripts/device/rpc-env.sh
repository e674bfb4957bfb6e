# Sourced on the GPU machine: unpack .devcarry/rpc-debs (scripts/device/fetch-rpc-debs.sh) into
# /tmp/x4-rpc (not into /: Debian's libraries beside Ubuntu's could break the image) and point
# pkg-config, the linker, the loader and PATH there, so `meson setup -Drpc=enabled` finds
# protobuf-c, protoc-c, libevent, libsystemd and jansson. Returns 1 when the debs are missing.
x4_rpc_env() {
        local src=${1:-.devcarry/rpc-debs} pre=/tmp/x4-rpc f
        ls "$src"/*.deb >/dev/null 2>&1 || { echo "rpc-env: no .deb files in $src (fetch-rpc-debs.sh, carry)"; return 1; }
        mkdir -p "$pre"
        for f in "$src"/*.deb; do dpkg -x "$f" "$pre" || return 1; done
        # the .pc files say prefix=/usr: move them to the unpacked tree
        for f in "$pre"/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc "$pre"/usr/share/pkgconfig/*.pc; do
                [ -f "$f" ] && sed -i -E "s@^(prefix|exec_prefix|libdir|includedir)=/usr@\\1=$pre/usr@" "$f"
        done
        export PKG_CONFIG_PATH=$pre/usr/lib/x86_64-linux-gnu/pkgconfig:$pre/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
        export LIBRARY_PATH=$pre/usr/lib/x86_64-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}
        export LD_LIBRARY_PATH=$pre/usr/lib/x86_64-linux-gnu:$pre/usr/lib/x86_64-linux-gnu/systemd:$pre/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
        export PATH=$pre/usr/bin:$PATH
        echo "rpc-env: $(ls "$src"/*.deb | wc -l) packages under $pre; protoc-c $(protoc-c --version 2>&1 | head -1)"
}
