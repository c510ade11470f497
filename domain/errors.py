"""Errors a pure handler may raise."""


class Rejected(Exception):
    """The handler refuses the message for good (a business rule, an impossible command).

    The consumer dead-letters it with `reason` (protocol 7, permanent errors).
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
