"""The PDF renderer: a real PDF, the same bytes for the same document, clear errors."""

from __future__ import annotations

import zlib
from datetime import date
from decimal import Decimal

import pytest

from adapters.pdf.renderer import PdfRenderer
from domain.documents import Document
from domain.sample.billing import Line, invoice_document

LINES = (Line(1, 155, Decimal(17), Decimal("17954.55"), Decimal("0.04"), Decimal("0.02")),)


def _text(pdf: bytes) -> bytes:
    """The page content streams, inflated (fpdf2 compresses them)."""
    out = b""
    for chunk in pdf.split(b"stream\n")[1:]:
        body = chunk.split(b"\nendstream")[0]
        try:
            out += zlib.decompress(body)
        except zlib.error:
            out += body
    return out


def test_an_invoice_renders_to_a_deterministic_pdf() -> None:
    doc = invoice_document(7, 42, date(1996, 1, 2), "1-URGENT", LINES, (2,), Decimal("17581.10"))
    renderer = PdfRenderer()
    first, second = renderer.render(doc), renderer.render(doc)
    assert first.startswith(b"%PDF-")
    assert first.rstrip().endswith(b"%%EOF")
    assert first == second  # replaying a decision makes the same object
    content = _text(first)
    for text in (b"Invoice for order 7", b"17581.10", b"17954.55", b"1996-01-02"):
        assert text in content
    other = invoice_document(7, 42, date(1996, 1, 2), "1-URGENT", LINES, (), Decimal("1.00"))
    assert renderer.render(other) != first
    assert renderer.media_type == "application/pdf"


def test_text_a_core_font_cannot_print_is_a_value_error() -> None:
    doc = Document("Rechnung \u2603", (), ("a",), (("1",),), ())
    with pytest.raises(ValueError, match="Latin-1"):
        PdfRenderer().render(doc)


def test_a_row_of_the_wrong_width_is_refused() -> None:
    with pytest.raises(ValueError, match="2 cells for 1 columns"):
        Document("t", (), ("a",), (("1", "2"),), ())
