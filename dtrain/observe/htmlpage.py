"""A standalone HTML page holding Bokeh figures: no network, small.

BokehJS is most of such a page (``bokeh.min.js`` alone is 1.3 MB), so it goes
in LZMA-compressed (280 kB; deflate, which browsers could inflate themselves,
leaves 350 kB) and written with :data:`ALPHABET` (13 bits in two printable
characters, 23 % over the bytes where base64 adds 33 %); the page's own small
decoder (:data:`UNPACK_JS`) unpacks it, runs it, then draws the figures.  The
figures' document (the models and their data) stays plain JSON in the page.
Everything else on the page is plain HTML: the figures' places are
``<!--root:NAME-->`` comments in the body.
"""
from __future__ import annotations

import functools
import html
import lzma
from collections.abc import Mapping

import numpy as np
from bokeh.embed import components
from bokeh.embed.bundle import bundle_for_objs_and_resources
from bokeh.model import Model
from bokeh.resources import INLINE

# 91 printable ASCII characters: all of "!".."~" but "<", ">" and "&" (nothing the HTML
# parser reads inside a script); a pair of them holds 13 bits (91 * 91 = 8281 >= 8192).
ALPHABET = "".join(c for c in map(chr, range(0x21, 0x7F)) if c not in "<>&")
BITS = 13
# lc=3 lp=0 pb=0 suits text (no 2- or 4-byte alignment to model); preset 6 packs BokehJS in
# about half a second, as tightly as 9.
LZMA_FILTER = {"id": lzma.FILTER_LZMA1, "preset": 6, "lc": 3, "lp": 0, "pb": 0}

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 12px 20px;
       color: #222; }
h1 { margin: 4px 0; font-size: 24px; } h2 { margin: 24px 0 4px; font-size: 19px; }
h3 { margin: 14px 0 6px; font-size: 15px; }
.grid { display: grid; grid-template-columns: repeat(2, minmax(0, 1fr)); gap: 12px 20px;
        align-items: start; }
@media (max-width: 900px) { .grid { grid-template-columns: minmax(0, 1fr); } }
.wide { margin: 8px 0; }
.note { color: #555; font-size: 13px; margin: 2px 0 8px; }
table.kv { border-collapse: collapse; font-size: 13px; }
table.kv th, table.kv td { border: 1px solid #ccc; padding: 2px 8px; text-align: left; }
table.kv td.num { text-align: right; font-variant-numeric: tabular-nums; }
table.kv th { background: #f3f3f3; }
"""

# Unpack BokehJS (:data:`ALPHABET` text -> LZMA bytes -> JavaScript), run it, then the
# figures' script (the body of dtrainEmbed).  The LZMA decoder follows the structure of Igor
# Pavlov's public-domain reference decoder (LzmaSpec.cpp), for an ".lzma" stream of a known
# unpacked size; the whole output is its dictionary.
UNPACK_JS = r"""
function dtrainText(el) {
  const text = el.textContent.trim(), size = Number(el.dataset.bytes);
  const alphabet = el.dataset.alphabet, value = new Int16Array(128).fill(-1);
  for (let i = 0; i < alphabet.length; i++) value[alphabet.charCodeAt(i)] = i;
  const bytes = new Uint8Array(size);
  let acc = 0, bits = 0, n = 0;
  for (let i = 0; i + 1 < text.length && n < size; i += 2) {
    acc |= (value[text.charCodeAt(i)] * 91 + value[text.charCodeAt(i + 1)]) << bits;
    for (bits += 13; bits >= 8 && n < size; bits -= 8, acc >>>= 8) bytes[n++] = acc & 255;
  }
  return new TextDecoder().decode(dtrainLzma(bytes, Number(el.dataset.unpacked)));
}

function dtrainLzma(src, size) {
  const props = src[0], lc = props % 9, lp = Math.floor(props / 9) % 5;
  const pb = Math.floor(props / 45), out = new Uint8Array(size);
  let pos = 14, range = 0xFFFFFFFF, code = 0;          // 13 header bytes, then a 0 byte
  for (let i = 0; i < 4; i++) code = code * 256 + src[pos++];
  const probs = (n) => new Uint16Array(n).fill(1024);
  const bit = (p, i) => {
    const v = p[i], bound = (range >>> 11) * v;
    let b = 0;
    if (code < bound) { range = bound; p[i] = v + ((2048 - v) >> 5); }
    else { range -= bound; code -= bound; p[i] = v - (v >> 5); b = 1; }
    if (range < 0x1000000) { range *= 256; code = code * 256 + src[pos++]; }
    return b;
  };
  const direct = (count) => {
    let res = 0;
    for (; count > 0; count--) {
      range = range >>> 1;
      let b = 0;
      if (code >= range) { code -= range; b = 1; }
      if (range < 0x1000000) { range *= 256; code = code * 256 + src[pos++]; }
      res = res * 2 + b;
    }
    return res;
  };
  const tree = (p, off, count) => {
    let m = 1;
    for (let i = 0; i < count; i++) m = (m << 1) + bit(p, off + m);
    return m - (1 << count);
  };
  const reverse = (p, off, count) => {
    let m = 1, sym = 0;
    for (let i = 0; i < count; i++) { const b = bit(p, off + m); m = (m << 1) + b; sym |= b << i; }
    return sym;
  };
  const lengths = () => ({choice: probs(2), low: probs(128), mid: probs(128), high: probs(256)});
  const length = (d, posState) => !bit(d.choice, 0) ? tree(d.low, posState << 3, 3)
    : !bit(d.choice, 1) ? 8 + tree(d.mid, posState << 3, 3) : 16 + tree(d.high, 0, 8);
  const literal = probs(0x300 << (lc + lp)), slot = probs(256), special = probs(115);
  const align = probs(16), isMatch = probs(192), isRep = probs(12), isRepG0 = probs(12);
  const isRepG1 = probs(12), isRepG2 = probs(12), isRep0Long = probs(192);
  const lenCoder = lengths(), repCoder = lengths();
  let state = 0, rep0 = 0, rep1 = 0, rep2 = 0, rep3 = 0, n = 0;
  while (n < size) {
    const posState = n & ((1 << pb) - 1);
    if (!bit(isMatch, (state << 4) + posState)) {
      const prev = n > 0 ? out[n - 1] : 0;
      const base = 0x300 * (((n & ((1 << lp) - 1)) << lc) + (prev >> (8 - lc)));
      let sym = 1;
      if (state >= 7) {
        let match = out[n - rep0 - 1];
        while (sym < 0x100) {
          const matchBit = (match >> 7) & 1;
          match <<= 1;
          const b = bit(literal, base + ((1 + matchBit) << 8) + sym);
          sym = (sym << 1) | b;
          if (b !== matchBit) break;
        }
      }
      while (sym < 0x100) sym = (sym << 1) | bit(literal, base + sym);
      out[n++] = sym - 0x100;
      state = state < 4 ? 0 : state < 10 ? state - 3 : state - 6;
      continue;
    }
    let len;
    if (bit(isRep, state)) {
      if (!bit(isRepG0, state)) {
        if (!bit(isRep0Long, (state << 4) + posState)) {
          state = state < 7 ? 9 : 11;
          out[n] = out[n - rep0 - 1];
          n++;
          continue;
        }
      } else {
        let dist;
        if (!bit(isRepG1, state)) dist = rep1;
        else {
          if (!bit(isRepG2, state)) dist = rep2;
          else { dist = rep3; rep3 = rep2; }
          rep2 = rep1;
        }
        rep1 = rep0;
        rep0 = dist;
      }
      len = length(repCoder, posState);
      state = state < 7 ? 8 : 11;
    } else {
      rep3 = rep2; rep2 = rep1; rep1 = rep0;
      len = length(lenCoder, posState);
      state = state < 7 ? 7 : 10;
      const s = tree(slot, Math.min(len, 3) << 6, 6);
      if (s < 4) rep0 = s;
      else {
        const count = (s >> 1) - 1;
        rep0 = (2 + (s & 1)) * 2 ** count;
        if (s < 14) rep0 += reverse(special, rep0 - s, count);
        else rep0 += direct(count - 4) * 16 + reverse(align, 0, 4);
      }
      if (rep0 === 0xFFFFFFFF) break;                  // the end marker
      if (rep0 >= n) throw new Error("corrupt LZMA data");
    }
    for (len += 2; len > 0 && n < size; len--, n++) out[n] = out[n - rep0 - 1];
  }
  if (n !== size) throw new Error("LZMA data ended early");
  return out;
}
"""

LOADER = """
(() => {
  const note = document.getElementById("dtrain-loading");
  try {
    const bokeh = document.createElement("script");
    bokeh.textContent = dtrainText(document.getElementById("dtrain-bokehjs"));
    document.head.appendChild(bokeh);
    dtrainEmbed();
    note.remove();
  } catch (err) {
    note.textContent = "The charts could not be drawn: " + err;
    throw err;
  }
})();
"""


def encode(data: bytes) -> str:
    """``data`` in :data:`ALPHABET`: each 13 bits (little-endian) as two characters."""
    bits = np.unpackbits(np.frombuffer(data, np.uint8), bitorder="little")   # (8 n,)
    bits = np.pad(bits, (0, -len(bits) % BITS)).reshape(-1, BITS)           # (g, 13)
    values = bits.astype(np.uint16) @ (1 << np.arange(BITS, dtype=np.uint16))  # (g,)
    chars = np.frombuffer(ALPHABET.encode(), np.uint8)
    pairs = np.stack([chars[values // 91], chars[values % 91]], axis=1)   # (g, 2)
    return pairs.tobytes().decode()


def decode(text: str, size: int) -> bytes:
    """The inverse of :func:`encode` (what the page's loader does), for checks."""
    value = {c: i for i, c in enumerate(ALPHABET)}
    acc = bits = 0
    out = bytearray()
    for i in range(0, len(text) - 1, 2):
        acc |= (value[text[i]] * 91 + value[text[i + 1]]) << bits
        bits += BITS
        while bits >= 8:
            out.append(acc & 255)
            acc, bits = acc >> 8, bits - 8
    return bytes(out[:size])


def pack(text: str) -> tuple[str, int, int]:
    """``text`` LZMA-compressed (an ".lzma" stream) in :data:`ALPHABET`, the stream's size
    and the size of ``text`` in UTF-8."""
    raw = text.encode()
    packed = lzma.compress(raw, format=lzma.FORMAT_ALONE, filters=[LZMA_FILTER])
    return encode(packed), len(packed), len(raw)


def packed_script(text: str, element_id: str) -> str:
    """A ``<script type="text/plain">`` holding :func:`pack` of ``text``, which
    ``dtrainText(element)`` of :data:`UNPACK_JS` turns back into ``text``."""
    data, size, unpacked = _pack_cached(text) if len(text) > 100_000 else pack(text)
    return (f'<script type="text/plain" id="{element_id}" data-bytes="{size}" '
            f'data-unpacked="{unpacked}" data-alphabet="{html.escape(ALPHABET)}">'
            f"{data}</script>")


_pack_cached = functools.lru_cache(maxsize=4)(pack)    # BokehJS: once per process


def page(title: str, body: str, roots: Mapping[str, Model]) -> str:
    """A standalone page: ``body`` (HTML) with ``<!--root:NAME-->`` replaced by the Bokeh
    model ``roots[NAME]``, and BokehJS inline, packed."""
    script, divs = components(dict(roots), wrap_script=False)
    for name, div in divs.items():
        body = body.replace(f"<!--root:{name}-->", div)
    bokehjs = "\n".join(bundle_for_objs_and_resources(list(roots.values()), INLINE).js_raw)
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{html.escape(title)}</title>
<style>{STYLE}</style>
</head>
<body>
<p id="dtrain-loading" class="note">Drawing the charts...</p>
<noscript><p>The charts of this page are drawn by Bokeh with JavaScript.</p></noscript>
{body}
{packed_script(bokehjs, "dtrain-bokehjs")}
<script>{UNPACK_JS}
function dtrainEmbed() {{
{script}
}}
{LOADER}</script>
</body>
</html>
"""
