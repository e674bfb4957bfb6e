# SPDX-License-Identifier: MIT
"""A copy of a GGUF file with another tokenizer.chat_template (its other keys, tensor infos and
data as they are): python3 gguf_retemplate.py SRC DST TEMPLATE_FILE. For tests of templates the
fixtures do not carry."""
import struct, sys
src, dst, tmpl = sys.argv[1], sys.argv[2], open(sys.argv[3]).read()
b = open(src, 'rb').read()
o = 0
def rd(fmt):
    global o
    v = struct.unpack_from(fmt, b, o); o += struct.calcsize(fmt); return v
magic, ver = rd('<4sI'); nt, nkv = rd('<QQ')
def rstr():
    global o
    (n,) = rd('<Q'); s = b[o:o+n]; o += n; return s
SZ = {0:1,1:1,2:2,3:2,4:4,5:4,6:4,7:1,10:8,11:8,12:8}
def rval(t):
    global o
    if t == 8: return rstr()
    if t == 9:
        (et, n) = rd('<IQ'); return [rval(et) for _ in range(n)]
    v = b[o:o+SZ[t]]; o += SZ[t]; return v
kvs = []
for _ in range(nkv):
    k = rstr(); (t,) = rd('<I'); start = o; rval(t); kvs.append((k, t, b[start:o]))
tinfo_start = o
for _ in range(nt):
    rstr(); (nd,) = rd('<I'); rd('<%dQ' % nd); rd('<I'); rd('<Q')
tinfo = b[tinfo_start:o]
align = 32
for k, t, raw in kvs:
    if k == b'general.alignment': align = struct.unpack('<I', raw)[0]
data_start = (o + align - 1) // align * align
out = bytearray(struct.pack('<4sIQQ', magic, ver, nt, nkv))
for k, t, raw in kvs:
    out += struct.pack('<Q', len(k)) + k + struct.pack('<I', t)
    if k == b'tokenizer.chat_template':
        e = tmpl.encode(); out += struct.pack('<Q', len(e)) + e
    else:
        out += raw
out += tinfo
out += b'\0' * ((-len(out)) % align)
out += b[data_start:]
open(dst, 'wb').write(out)
