"""PDF rendering of handler documents (fpdf2)."""
