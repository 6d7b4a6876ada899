"""Stage 4: answers shown: terminal text, the HTML report, the diff's tables and the
live watch."""
