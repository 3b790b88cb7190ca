#!/bin/sh
# check_packaging.sh SOURCE_DIR BUILD_DIR — TAP: the shared library exports only qkv_ symbols; an installed
# qkv (meson install + qkv.pc) builds and runs a program through pkg-config; another meson project uses qkv
# as a subproject through dependency('qkv').
src=$1
build=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "1..3"

lib=$(ls "$build"/libqkv.so 2>/dev/null)
bad=$(nm -D --defined-only "$lib" 2>/dev/null | awk '{print $3}' | grep -v '^qkv_')
if [ -n "$lib" ] && [ -z "$bad" ] && nm -D --defined-only "$lib" | grep -q ' qkv_backward$'; then
    echo "ok 1 - libqkv.so exports only qkv_ symbols"
else
    echo "not ok 1 - libqkv.so exports only qkv_ symbols"
    echo "# unexpected: $bad"
fi

cat >"$tmp/app.c" <<'C'
#include <qkv.h>
int main(void) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *a = qkv_ones(ctx, QKV_F32, 2, (int64_t[]){2, 3});
    qkv_tensor *s = qkv_sum(ctx, qkv_softmax(ctx, a, NULL, 0));
    int ok = s && qkv_f32(s)[0] > 1.999f && qkv_f32(s)[0] < 2.001f;
    qkv_ctx_free(ctx);
    return ok ? 0 : 1;
}
C
if meson install -C "$build" --destdir "$tmp/root" >"$tmp/install.log" 2>&1; then
    prefix=$(meson introspect "$build" --buildoptions | python3 -c 'import json,sys; print([o["value"] for o in json.load(sys.stdin) if o["name"]=="prefix"][0])')
    pc=$(dirname "$(find "$tmp/root" -name qkv.pc | head -n 1)")
    if PKG_CONFIG_PATH="$pc" PKG_CONFIG_SYSROOT_DIR="$tmp/root" cc "$tmp/app.c" -o "$tmp/app" \
        $(PKG_CONFIG_PATH="$pc" PKG_CONFIG_SYSROOT_DIR="$tmp/root" pkg-config --cflags --libs --static qkv) -static-libgcc \
        >"$tmp/cc.log" 2>&1 && LD_LIBRARY_PATH="$tmp/root$prefix/lib/x86_64-linux-gnu:$tmp/root$prefix/lib" "$tmp/app"; then
        echo "ok 2 - meson install, then pkg-config --cflags --libs qkv builds and runs a program"
    else
        echo "not ok 2 - meson install, then pkg-config --cflags --libs qkv builds and runs a program"
        sed 's/^/# /' "$tmp/cc.log"
    fi
else
    echo "not ok 2 - meson install"
    sed 's/^/# /' "$tmp/install.log" | tail -5
fi

mkdir -p "$tmp/proj/subprojects"
ln -s "$(cd "$src" && pwd)" "$tmp/proj/subprojects/qkv"
cp "$tmp/app.c" "$tmp/proj/app.c"
cat >"$tmp/proj/meson.build" <<'M'
project('uses_qkv', 'c', default_options : ['c_std=c17'])
qkv = dependency('qkv', fallback : ['qkv', 'qkv_dep'])
executable('app', 'app.c', dependencies : qkv)
M
if meson setup "$tmp/proj/build" "$tmp/proj" -Dqkv:tests=false -Dqkv:examples=false -Dqkv:bench=false \
        >"$tmp/sub.log" 2>&1 && ninja -C "$tmp/proj/build" >>"$tmp/sub.log" 2>&1 && "$tmp/proj/build/app"; then
    echo "ok 3 - another meson project uses qkv as a subproject"
else
    echo "not ok 3 - another meson project uses qkv as a subproject"
    tail -5 "$tmp/sub.log" | sed 's/^/# /'
fi
