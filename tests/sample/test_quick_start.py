"""The quick start as a new user follows it: the messages the README and getting-started show
are the file the sample ships (`docs/sample/orders.jsonl`), and `eo embedded` on that file, run
from the project's directory as documented, gives what the docs describe."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

from tests.support.processes import eo_command

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "docs" / "sample" / "orders.jsonl"


def _first_json_block(doc: Path) -> list[str]:
    found = re.search(r"^```json\n(.*?)^```", doc.read_text(), re.MULTILINE | re.DOTALL)
    assert found, f"{doc.name}: no json block"
    return found.group(1).splitlines()


def test_the_docs_show_the_shipped_messages() -> None:
    shipped = SHIPPED.read_text().splitlines()
    assert len(shipped) == 4
    assert _first_json_block(ROOT / "README.md") == shipped
    assert _first_json_block(ROOT / "docs" / "getting-started.md") == shipped


def test_eo_embedded_on_the_shipped_messages_does_what_the_docs_say() -> None:
    done = subprocess.run([*eo_command(), "embedded", "docs/sample/orders.jsonl", "--format",
                           "json"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if not k.startswith("EO_")})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["input"] == {"lines": 4, "published": 4, "rejected": []}
    # the gateway drops the producer's copy, orders drops the gateway's re-publication
    assert report["settled"]["gateway"]["duplicate"] == 1
    assert report["settled"]["orders"]["duplicate"] == 1
    order = report["states"]["orders"]["1"]
    assert (order["status"], order["lines"][0]["line_number"]) == ("rejected", 1)
    assert report["states"]["ledger"]["7"]["rejected"] == [1]  # "unknown account"
    assert report["dead_letters"] == {}
    assert set(report["at_rest"].values()) == {0}
    assert report["blobs"] == [order["invoice_key"]]
