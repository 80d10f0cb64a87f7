"""Makes the two fonts embedded in rlft-report: subsets of DejaVu Sans 2.37 (Book and Bold).

Latin-1 plus a few symbols the charts use, no hinting, renamed "rlft Report Sans" as the
Bitstream Vera licence asks of modified fonts (see LICENSE-DejaVu.txt beside this file).

    python -m pip install fonttools==4.60.1
    python make_fonts.py /usr/share/fonts/truetype/dejavu   # Debian's fonts-dejavu-core 2.37
"""

import sys
from pathlib import Path

from fontTools import subset
from fontTools.ttLib import TTFont

CODEPOINTS = (
    list(range(0x20, 0x7F))
    + list(range(0xA0, 0x100))
    + [0x0394, 0x03B2, 0x03B4, 0x03BC, 0x03C3, 0x2013, 0x2014, 0x2018, 0x2019, 0x201C, 0x201D]
    + [0x2022, 0x2026, 0x2190, 0x2191, 0x2192, 0x2193, 0x2212, 0x221E, 0x2248, 0x2264, 0x2265]
)
FAMILY = "rlft Report Sans"


def make(src: Path, dst: Path, style: str) -> None:
    font = TTFont(src)
    options = subset.Options()
    options.hinting = False
    options.layout_features = ["kern"]
    options.name_IDs = [0, 1, 2, 3, 4, 5, 6]
    subsetter = subset.Subsetter(options)
    subsetter.populate(unicodes=CODEPOINTS)
    subsetter.subset(font)
    full = f"{FAMILY} {style}" if style != "Book" else FAMILY
    ps = f"rlftReportSans-{style}"
    for rec in font["name"].names:
        if rec.nameID in (1, 16):
            rec.string = FAMILY
        elif rec.nameID == 3:
            rec.string = f"{ps} (subset of DejaVu Sans 2.37)"
        elif rec.nameID == 4:
            rec.string = full
        elif rec.nameID == 6:
            rec.string = ps
    font.save(dst)


def main() -> None:
    src = Path(sys.argv[1])
    here = Path(__file__).parent
    make(src / "DejaVuSans.ttf", here / "rlft-report-sans.ttf", "Book")
    make(src / "DejaVuSans-Bold.ttf", here / "rlft-report-sans-bold.ttf", "Bold")


if __name__ == "__main__":
    main()
