"""In-process adapters with real-store semantics: the embedded profile and the unit tests' fakes."""
