"""`DocumentRenderer` producing PDF with fpdf2, byte-for-byte deterministic."""

from __future__ import annotations

from datetime import UTC, datetime, time

from fpdf import FPDF
from fpdf.errors import FPDFUnicodeEncodingException

from application.ports import DocumentRenderer
from domain.documents import Document

_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


class PdfRenderer(DocumentRenderer):
    """A4 portrait, Helvetica (a core font: nothing to embed, Latin-1 text), the title, the
    fields, the table with a header row, the totals. The PDF's creation date is the
    document's date (or a fixed one), never the wall clock, so equal documents give equal
    bytes. Raises ValueError when a text is outside Latin-1 (core fonts cannot print it)."""

    media_type = "application/pdf"

    def render(self, document: Document) -> bytes:
        pdf = FPDF(orientation="P", unit="mm", format="A4")
        dated = (datetime.combine(document.dated, time(), UTC) if document.dated else _EPOCH)
        pdf.set_creation_date(dated)
        pdf.set_title(document.title)
        pdf.set_producer("exactly-once-template")
        pdf.add_page()
        try:
            self._write(pdf, document)
        except FPDFUnicodeEncodingException as exc:  # core fonts print Latin-1 only
            raise ValueError(f"text outside Latin-1: {exc}") from exc
        return bytes(pdf.output())

    def _write(self, pdf: FPDF, document: Document) -> None:
        pdf.set_font("Helvetica", style="B", size=16)
        pdf.cell(0, 10, document.title, new_x="LMARGIN", new_y="NEXT")
        pdf.set_font("Helvetica", size=10)
        for label, value in document.fields:
            pdf.cell(40, 6, label)
            pdf.cell(0, 6, value, new_x="LMARGIN", new_y="NEXT")
        pdf.ln(4)
        if document.columns:
            width = (pdf.w - pdf.l_margin - pdf.r_margin) / len(document.columns)
            pdf.set_font("Helvetica", style="B", size=9)
            for column in document.columns:
                pdf.cell(width, 7, column, border=1, align="C")
            pdf.ln()
            pdf.set_font("Helvetica", size=9)
            for row in document.rows:
                for cell in row:
                    pdf.cell(width, 6, cell, border=1, align="R")
                pdf.ln()
        pdf.ln(4)
        pdf.set_font("Helvetica", style="B", size=11)
        for label, value in document.totals:
            pdf.cell(40, 7, label)
            pdf.cell(0, 7, value, new_x="LMARGIN", new_y="NEXT")
