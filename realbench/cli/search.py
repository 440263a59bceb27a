"""`realbench search` (filled in by the search package)."""


def add_parser(sub) -> None:
    pass
