"""Find the argument of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in a LaTeX string, braces balanced."""

from __future__ import annotations

import re

_BOX_COMMAND = re.compile(r"\\(?:boxed|fbox)\s*\{")


def last_boxed_content(text: str) -> str | None:
    """Return the text inside the last ``\\boxed{...}`` of ``text``, or None if there is no closed one.

    Braces are matched by depth, so ``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``; an unclosed last box
    (a truncated response) falls back to the previous closed one.
    """
    for match in reversed(list(_BOX_COMMAND.finditer(text))):
        depth = 1
        for index in range(match.end(), len(text)):
            char = text[index]
            if char == "{":
                depth += 1
            elif char == "}":
                depth -= 1
                if depth == 0:
                    return text[match.end() : index]
    return None
