"""Document rendering (PDF with fpdf2, an optional dependency: the `sample` group)."""

from __future__ import annotations

from application.ports import DocumentRenderer
from domain.documents import Document


class MissingRenderer(DocumentRenderer):
    """Stands in when fpdf2 is not installed: rendering raises ValueError saying so (the
    attempt is dead-lettered with that reason; its token stays for a replay)."""

    media_type = "application/pdf"

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def render(self, document: Document) -> bytes:
        raise ValueError(f"rendering a Document needs fpdf2 (install the `sample` dependency "
                         f"group: uv sync --group sample): {self.reason}")


def document_renderer() -> DocumentRenderer:
    """The PDF renderer, or a `MissingRenderer` when fpdf2 cannot be imported."""
    try:
        from adapters.pdf.renderer import PdfRenderer
    except ImportError as exc:
        return MissingRenderer(str(exc))
    return PdfRenderer()
