"""ephemeral.shown: an event's text made inert for a terminal, as ephemeral(1) prints it
(core/cmd_run.c, shown(); tests/live-output.test compares the two on a real run's output).
No daemon needed."""

import os
import unittest

from ephemeral import shown
from ephemeral.client import Event


class Shown(unittest.TestCase):
    def test_escape_sequences_are_shown_not_sent(self):
        # OSC 52 (write the clipboard), CSI 2J (clear the screen), a C1 CSI alone (U+009B)
        hostile = "a\x1b]52;c;SGVsbG8=\x07b\x1b[2Jc\x9bd\n"
        self.assertEqual(shown(hostile), "a\\x1b]52;c;SGVsbG8=\\x07b\\x1b[2Jc\\xc2\\x9bd\n")

    def test_every_control_but_newline_and_tab(self):
        for o in list(range(0x20)) + [0x7F]:
            want = chr(o) if chr(o) in "\n\t" else "\\x%02x" % o
            self.assertEqual(shown("<%s>" % chr(o)), "<%s>" % want, hex(o))
        for o in range(0x80, 0xA0):  # C1: both bytes of its UTF-8 form, as the CLI writes them
            self.assertEqual(shown(chr(o)), "\\xc2\\x%02x" % o, hex(o))

    def test_other_text_unchanged(self):
        for text in ("plain", " ~", "\xa0é€😀", "line 1\nline 2\tend", "\\x1b stays as typed"):
            self.assertEqual(shown(text), text)
        self.assertEqual(shown(None), "")
        self.assertEqual(shown(""), "")

    def test_the_readme_example_prints_nothing_a_terminal_runs(self):
        # The README's loop over a run's events, its print line run on a hostile event (it
        # printed event.text raw: the escape sequences reached the reader's terminal).
        readme = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "README.md")
        lines = open(readme, encoding="utf-8").read().splitlines()
        i = next(i for i, l in enumerate(lines) if l.startswith("for event in client.runs.events("))
        body = lines[i + 1].strip()
        self.assertTrue(body.startswith("print("), body)
        event = Event({"seq": 3, "t": 1.5, "source": "Shell\x1b]0;pwned\x07", "kind": "output",
                       "text": "\x1b]52;c;SGVsbG8=\x07\x1b[2J\x9b31m"})
        printed = []
        exec(body, {"shown": shown, "event": event,
                    "print": lambda *a, **k: printed.append(" ".join(map(str, a)))})
        self.assertEqual(len(printed), 1, printed)
        self.assertFalse([c for c in printed[0] if ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F],
                         printed[0])
        self.assertIn("\\x1b]52;c;SGVsbG8=\\x07", printed[0])


if __name__ == "__main__":
    unittest.main()
