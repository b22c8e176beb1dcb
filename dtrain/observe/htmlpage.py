"""A standalone HTML page holding Bokeh figures: no network, small.

BokehJS is most of such a page (``bokeh.min.js`` alone is 1.3 MB), and the
figures' document (their models and data) most of the rest, so both go in
deflated (zlib, best level: 350 kB and about 20 kB) and written in base85
(Python's :func:`base64.b85encode`, RFC 1924's alphabet: 25 % over the bytes
where base64 adds 33 %).  The page turns them back with the browser's own
``DecompressionStream("deflate")`` (:data:`UNPACK_JS`, async), runs BokehJS,
then the figures' script.  :func:`unpack` does the same in Python, for checks.
Everything else on the page is plain HTML: the figures' places are
``<!--root:NAME-->`` comments in the body.
"""
from __future__ import annotations

import base64
import functools
import html
import re
import zlib
from collections.abc import Mapping

from bokeh.embed import components
from bokeh.embed.bundle import bundle_for_objs_and_resources
from bokeh.model import Model
from bokeh.resources import INLINE

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

# Base85 text (whitespace ignored) -> zlib stream -> the browser's inflater -> UTF-8 text.
# The zlib stream's Adler-32 check catches a damaged payload.
UNPACK_JS = r"""
const DTRAIN_B85 =
  "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~";

function dtrainBytes(text) {
  const s = text.replace(/\s+/g, ""), tail = s.length % 5, pad = tail ? 5 - tail : 0;
  const digit = new Uint8Array(128), padded = s + "~".repeat(pad);
  for (let i = 0; i < 85; i++) digit[DTRAIN_B85.charCodeAt(i)] = i;
  const out = new Uint8Array(padded.length / 5 * 4), view = new DataView(out.buffer);
  for (let i = 0; i < padded.length; i += 5) {
    let v = 0;
    for (let k = 0; k < 5; k++) v = v * 85 + digit[padded.charCodeAt(i + k)];
    view.setUint32(i / 5 * 4, v);                      // big-endian, as RFC 1924
  }
  return out.subarray(0, out.length - pad);
}

function dtrainText(el) {
  const bytes = new Blob([dtrainBytes(el.textContent)]).stream();
  return new Response(bytes.pipeThrough(new DecompressionStream("deflate"))).text();
}
"""

LOADER = """
(async () => {
  const note = document.getElementById("dtrain-loading");
  try {
    const ids = ["dtrain-bokehjs", "dtrain-figures"];
    const texts = await Promise.all(ids.map(id => dtrainText(document.getElementById(id))));
    for (const text of texts) {                        // BokehJS, then the figures
      const script = document.createElement("script");
      script.textContent = text;
      document.head.appendChild(script);
    }
    note.remove();
  } catch (err) {
    note.textContent = "The charts could not be drawn: " + err;
    throw err;
  }
})();
"""


def encode(data: bytes) -> str:
    """``data`` in base85, any ``<!--`` broken by a newline (which the page skips): inside
    a script element it would start HTML's "escaped" parsing.  RFC 1924's alphabet has no
    ``/``, so ``</script`` cannot occur."""
    return base64.b85encode(data).decode().replace("<!--", "<!\n--")


def pack(text: str) -> str:
    """``text`` in UTF-8, deflated (a zlib stream, best level), then :func:`encode`."""
    return encode(zlib.compress(text.encode(), 9))


_pack_cached = functools.lru_cache(maxsize=4)(pack)    # BokehJS: once per process


def packed_script(text: str, element_id: str) -> str:
    """A ``<script type="text/plain">`` holding :func:`pack` of ``text``, which
    ``dtrainText(element)`` of :data:`UNPACK_JS` resolves to ``text``."""
    data = _pack_cached(text) if len(text) > 100_000 else pack(text)
    return f'<script type="text/plain" id="{element_id}">{data}</script>'


def unpack(page: str, element_id: str) -> str:
    """The text packed in ``page``'s element ``element_id`` (what the page's loader runs)."""
    found = re.search(f'<script type="text/plain" id="{re.escape(element_id)}">([^/]*)'
                      "</script>", page)                 # base85 has no "/"
    if found is None:
        raise ValueError(f"no packed script {element_id!r} in the page")
    return zlib.decompress(base64.b85decode(re.sub(r"\s+", "", found.group(1)))).decode()


def page(title: str, body: str, roots: Mapping[str, Model]) -> str:
    """A standalone page: ``body`` (HTML) with ``<!--root:NAME-->`` replaced by the Bokeh
    model ``roots[NAME]``; BokehJS and the figures' script inline, packed."""
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
{packed_script(script, "dtrain-figures")}
<script>{UNPACK_JS}{LOADER}</script>
</body>
</html>
"""
