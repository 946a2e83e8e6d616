"""report.html in a real headless browser (Chromium from the system's packages) at a fixed viewport width: it renders,
every figure loads, and nothing is wider than the viewport (wide tables scroll inside their own box). Skipped, with
the reason, where no Chromium is installed (`apt-get install chromium` installs one)."""

import json
import re
import shutil
import subprocess

import pandas as pd
import pytest

from dwg.dev.testing import synthetic_paper_results
from dwg.science.pictures.report import Html, verdicts_html, write_report
from dwg.science.verdicts.claims import claims_table

WIDTH = 1000  # the viewport's width in CSS pixels
BROWSER = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)

# run in the page once it has loaded: how many images, how many did not load, what sticks out past the viewport
PROBE = """<script>
addEventListener("load", () => {
  const width = document.documentElement.clientWidth, images = [...document.images];
  const shown = [...document.querySelectorAll("body *")].filter(e => !e.closest(".wide, details:not([open])"));
  const out = shown.filter(e => e.getBoundingClientRect().right > width + 1).map(e => e.tagName + "." + e.className);
  document.body.dataset.probe = JSON.stringify({width, scroll: document.documentElement.scrollWidth,
    images: images.length, broken: images.filter(i => !(i.complete && i.naturalWidth > 0)).length, out});
});
</script>"""


def wide_svg(width: int, height: int) -> str:
    "An SVG as the figures are drawn: wider than any page, with its viewBox."
    bars = "".join(f'<rect x="{x}" y="40" width="30" height="400" fill="#4c78a8"/>' for x in range(0, width, 60))
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}">{bars}<text x="{width - 120}" y="20">legend</text></svg>'
    )


def probe(page) -> dict:
    "Open `page` (a report with the probe) in the headless browser; what the probe found."
    cmd = [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", f"--window-size={WIDTH},900"]
    cmd += ["--virtual-time-budget=5000", "--dump-dom", page.as_uri()]
    dom = subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout
    found = re.search(r'data-probe="([^"]*)"', dom)
    assert found, f"the page did not finish loading in the browser: {dom[:500]}"
    return json.loads(found.group(1).replace("&quot;", '"'))


@pytest.mark.skipif(BROWSER is None, reason="no Chromium installed (apt-get install chromium)")
def test_report_fits_the_viewport(tmp_path):
    "A report with the verdicts, a figure three viewports wide, a 40-column table and the provenance."
    (tmp_path / "components.svg").write_text(wide_svg(3 * WIDTH, 500))
    claims = claims_table(synthetic_paper_results(n_facts=6), n_boot=50)
    wide = pd.DataFrame({f"column {i} with a long name": [f"0.{i:02d} [0.00, 1.00]"] for i in range(40)})
    provenance = dict(commit="0123abc", machine=dict(cpu="AMD EPYC", cores=2, flags=["avx2", "avx512_bf16"]))
    sections = [
        ("The paper's claims, measured", verdicts_html(claims)),
        ("Wide table", wide),
        ("Note", Html("<p>x</p>")),
    ]
    report = write_report(tmp_path, sections, {"components": tmp_path / "components.svg"}, provenance, figures_at=1)
    page = tmp_path / "probed.html"
    page.write_text(report.read_text().replace("</body>", PROBE + "</body>"))
    got = probe(page)
    assert WIDTH - 30 < got["width"] <= WIDTH and got["images"] == 1 and got["broken"] == 0, got  # less a scrollbar
    assert got["out"] == [] and got["scroll"] <= WIDTH, got
