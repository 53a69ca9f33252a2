"""Fill in the repository's address where the Colab notebook needs it: the "Open in Colab" links
(README.md, docs/devices.md, the notebook's own badge) and the notebook's REPO_URL, which it
clones on Colab. They hold the placeholder OWNER/jaxgpt until this is run once, by whoever
publishes the repository on GitHub:

    python notebooks/set_repository.py alice/jaxgpt

Every place is found by the same text, github.com/OWNER/jaxgpt or github/OWNER/jaxgpt, so the
links and the clone always name one repository (tests/test_visibility.py checks they agree).
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLACES = ["README.md", "docs/devices.md", "notebooks/colab_tpu.ipynb"]
PLACEHOLDER = "OWNER/jaxgpt"
# a GitHub repository as it appears in a Colab link (colab.../github/O/N/blob/...) or a clone URL
REPOSITORY = re.compile(
    r"(?<=colab\.research\.google\.com/github/)[\w.-]+/[\w.-]+|(?<=https://github\.com/)[\w.-]+/[\w.-]+"
)


def repositories(root: Path = ROOT) -> set[str]:
    """Every repository the Colab links and REPO_URL name (one, when they agree)."""
    return {name.removesuffix(".git") for place in PLACES for name in REPOSITORY.findall((root / place).read_text())}


def main() -> None:
    if len(sys.argv) != 2 or not re.fullmatch(r"[\w.-]+/[\w.-]+", sys.argv[1]):
        sys.exit("usage: python notebooks/set_repository.py OWNER/NAME  (the GitHub repository, e.g. alice/jaxgpt)")
    (current,) = repositories() or {PLACEHOLDER}
    for place in PLACES:
        path = ROOT / place
        path.write_text(path.read_text().replace(f"github.com/{current}", f"github.com/{sys.argv[1]}")
                        .replace(f"github/{current}", f"github/{sys.argv[1]}"))  # fmt: skip
    print(f"the Colab links and REPO_URL now name {sys.argv[1]} (were {current})")


if __name__ == "__main__":
    main()
