"""The protocol's mutation suite: each named mutation removes one guard of docs/protocol.md
from a copy of the code, and the fast suite must fail (`./dev mutate`)."""
