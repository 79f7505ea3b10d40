"""Showing what a run wrote on a terminal.

An event's text (a command's output, the model's words, file names) comes from the sandbox
and the model: printed raw, an escape sequence in it acts on the reader's terminal (clear
the screen, retitle the window, write the clipboard with OSC 52). `shown` makes it inert
the way `ephemeral run` and `ephemeral runs replay` print it (core/cmd_run.c, shown()).
"""

from typing import Optional


def shown(text: Optional[str]) -> str:
    """text with every C0 control but newline and tab, DEL (U+007F) and the C1 controls
    (U+0080..U+009F, a CSI alone is U+009B) written as \\xHH per byte of its UTF-8 form
    (ESC is \\x1b, U+009B is \\xc2\\x9b), exactly as ephemeral(1) prints them; every other
    character, non-ASCII included, unchanged. None is "". Print events with it:

        print(f"{event.t:6.2f}  {shown(event.source):17} {shown(event.text)}")
    """
    out = []
    for ch in text or "":
        o = ord(ch)
        if (o < 0x20 and ch not in "\n\t") or o == 0x7F:
            out.append("\\x%02x" % o)
        elif 0x80 <= o <= 0x9F:
            out.append("\\xc2\\x%02x" % o)
        else:
            out.append(ch)
    return "".join(out)
