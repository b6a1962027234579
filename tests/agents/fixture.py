"""The small repository the agent CLIs work on: a Python package ``stock`` (prices,
stock levels, a report) whose discount rounds down where its tests expect rounding to
the nearest cent. The task: find why the tests fail and fix ``apply_discount``.

Generated, not shipped: every file's text comes from this module, deterministically, and
a git history of three commits (the last one brought the bug) with fixed authors and
dates, so ``git log`` and ``git diff`` print the same in every run. Sized so that reading
the files and running the tests makes a conversation of some 50-80k tokens with each
CLI's own prompt: over the windows the benchmark gives ctxd.
"""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

EDITED = "src/stock/pricing.py"
BUGGY = "    return int(price_cents * (100 - percent) / 100)\n"
FIXED = "    return (price_cents * (100 - percent) + 50) // 100\n"
"""The one line the task changes: truncation -> rounding half up."""

CATEGORIES = ("hardware", "garden", "kitchen", "office", "toys", "outdoor", "paint", "lighting")
WAREHOUSES = ("north", "south", "east", "west", "central")


def _items(n: int = 600) -> list[tuple[str, str, str, int, int, str]]:
    """Deterministic catalogue rows: sku, name, category, price in cents, quantity, warehouse."""
    rows = []
    for i in range(n):
        category = CATEGORIES[i % len(CATEGORIES)]
        sku = f"{category[:3].upper()}-{1000 + i * 7}"
        name = f"{category} item {i:03d} ({('small', 'medium', 'large', 'bulk')[i % 4]})"
        price = 99 + (i * 137) % 9900
        quantity = (i * 53) % 400
        rows.append((sku, name, category, price, quantity, WAREHOUSES[(i * 3) % len(WAREHOUSES)]))
    return rows


def _csv() -> str:
    lines = ["sku,name,category,price_cents,quantity,warehouse"]
    lines += [",".join(str(v) for v in row) for row in _items()]
    return "\n".join(lines) + "\n"


README = textwrap.dedent("""\
    # stock

    A small library that keeps a shop's catalogue: items, their prices in cents, their
    stock levels per warehouse, and the discounts the shop runs. It reads the catalogue
    from `data/items.csv`, answers questions about it (what is low, what is worth the
    most, what a basket costs after a discount) and prints a report for the weekly
    stock meeting.

    ## Layout

    - `src/stock/models.py`: `Item` and `Warehouse`, plain dataclasses.
    - `src/stock/loader.py`: reads the CSV catalogue, checking each row.
    - `src/stock/pricing.py`: discounts, taxes and basket totals, all in integer cents.
    - `src/stock/report.py`: the weekly report (totals per category and warehouse, low
      stock, the most valuable lines).
    - `tests/`: unittest suites, run with `python3 -m unittest -v` from the top.

    ## Money

    Every amount is an integer number of cents: no floats are stored. A discount of
    `percent` on a price gives the price less that share, **rounded to the nearest cent,
    halves up** (a 15% discount on 199 cents is 169.15, so 169; on 250 cents it is
    212.5, so 213). Taxes round the same way. Totals are sums of rounded lines, never
    rounded sums, so a receipt adds up line by line.

    ## Running

        python3 -m unittest -v           # every test
        python3 -m stock.report data/items.csv

    ## Conventions

    - No third-party dependencies: the standard library only.
    - A function that takes money takes and returns cents (`int`).
    - Errors say which row or which argument was wrong.
    - Every change comes with a test; the suite must pass before a commit.
    """)

DESIGN = textwrap.dedent("""\
    # Design notes

    ## Why cents

    Prices used to be floats, and the weekly report disagreed with the till by a cent
    here and there: 0.1 + 0.2 is not 0.3 in binary floating point, and a sum of a few
    hundred lines drifted. Since version 0.2 every amount is an integer number of cents.
    Conversions happen only at the edges: the loader reads `price_cents` as an integer,
    and the report formats cents as `12.34` when it prints.

    ## Rounding

    A discount or a tax produces a fraction of a cent. The shop's rule, agreed with the
    accountant, is to round each line to the nearest cent, halves up, and to add the
    rounded lines. Rounding halves to even (Python's `round`) was tried and dropped: the
    till rounds halves up, and the report must match the till to the cent. Truncation
    (rounding down) was never the rule: it makes every discounted line a fraction cheaper
    for the shop than the till says, and over a week of sales the report is short.

    The helper for this is integer arithmetic only: `(amount * numerator + denominator
    // 2) // denominator` rounds a non-negative fraction half up without floats.

    ## Stock levels

    A warehouse holds a quantity of each item. An item is low when its total quantity
    over all warehouses is below its reorder level (20 by default, per category in
    `pricing.REORDER_LEVELS`). The report lists low items first, then the most valuable
    lines (price times quantity), then totals per category and per warehouse.

    ## Loader

    The loader reads the CSV with the standard `csv` module. Each row must have the six
    columns of the header; `price_cents` and `quantity` must be non-negative integers; a
    SKU is three capital letters, a dash and digits. A bad row raises `LoaderError`
    naming the line number and the column, and nothing of the file is returned: a
    half-read catalogue would make a wrong report.

    ## Performance

    The catalogue has a few hundred lines; everything is linear and fast enough. The
    report sorts once per section. No caching, no indexes: simple code first.

    ## Testing

    The suites are plain `unittest`. Pricing is tested on a table of prices and
    percentages computed by hand; the report on the shipped catalogue, whose totals
    are checked against figures computed independently (see `tests/test_report.py`).
    """)

CHANGELOG = textwrap.dedent("""\
    # Changelog

    ## 0.4.0 (unreleased)

    - pricing: discounts computed without floats. (This release's last commit.)

    ## 0.3.0

    - report: low stock listed first, then the most valuable lines.
    - loader: a bad row names its line and column.
    - pricing: taxes per category.

    ## 0.2.0

    - Every amount is an integer number of cents (no floats stored).
    - report: totals per warehouse.

    ## 0.1.0

    - First version: items, warehouses, a CSV loader and a text report.
    """)

INIT = textwrap.dedent('''\
    """stock: a shop's catalogue, prices in cents, stock per warehouse."""

    from stock.models import Item, Warehouse
    from stock.pricing import apply_discount, apply_tax, basket_total

    __all__ = ["Item", "Warehouse", "apply_discount", "apply_tax", "basket_total"]
    __version__ = "0.4.0"
    ''')

MODELS = textwrap.dedent('''\
    """Items and warehouses: plain data, no behaviour beyond what they compute of themselves."""

    from __future__ import annotations

    from dataclasses import dataclass, field


    @dataclass(frozen=True)
    class Item:
        """One line of the catalogue. ``price_cents`` is the shelf price, tax included."""

        sku: str
        name: str
        category: str
        price_cents: int

        def __post_init__(self) -> None:
            if self.price_cents < 0:
                raise ValueError(f"{self.sku}: a price cannot be negative ({self.price_cents})")
            if not self.sku or "-" not in self.sku:
                raise ValueError(f"bad SKU {self.sku!r}: expected three letters, a dash and digits")

        @property
        def prefix(self) -> str:
            """The SKU's letters: the category's short name."""
            return self.sku.split("-", 1)[0]

        def value(self, quantity: int) -> int:
            """What ``quantity`` of this item is worth at its shelf price, in cents."""
            return self.price_cents * quantity


    @dataclass
    class Warehouse:
        """A warehouse and how many of each SKU it holds."""

        name: str
        quantities: dict[str, int] = field(default_factory=dict)

        def add(self, sku: str, quantity: int) -> None:
            if quantity < 0:
                raise ValueError(f"{self.name}: cannot add a negative quantity of {sku}")
            self.quantities[sku] = self.quantities.get(sku, 0) + quantity

        def remove(self, sku: str, quantity: int) -> None:
            held = self.quantities.get(sku, 0)
            if quantity > held:
                raise ValueError(f"{self.name}: only {held} of {sku}, cannot remove {quantity}")
            self.quantities[sku] = held - quantity

        def quantity(self, sku: str) -> int:
            return self.quantities.get(sku, 0)

        def skus(self) -> list[str]:
            return sorted(sku for sku, n in self.quantities.items() if n > 0)

        def total_units(self) -> int:
            return sum(self.quantities.values())


    def total_quantity(warehouses: list[Warehouse], sku: str) -> int:
        """How many of ``sku`` all the warehouses hold together."""
        return sum(w.quantity(sku) for w in warehouses)


    def stock_value(items: list[Item], warehouses: list[Warehouse]) -> int:
        """The value of everything in stock, in cents."""
        return sum(item.value(total_quantity(warehouses, item.sku)) for item in items)
    ''')

PRICING_BUGGY = textwrap.dedent('''\
    """Discounts, taxes and basket totals, in integer cents (see docs/design.md, "Rounding")."""

    from __future__ import annotations

    from stock.models import Item

    TAX_RATES = {  # percent, per category
        "hardware": 20,
        "garden": 10,
        "kitchen": 20,
        "office": 20,
        "toys": 5,
        "outdoor": 10,
        "paint": 20,
        "lighting": 20,
    }

    REORDER_LEVELS = {"hardware": 30, "garden": 15, "paint": 25}
    DEFAULT_REORDER_LEVEL = 20


    def _check_percent(percent: int) -> None:
        if not 0 <= percent <= 100:
            raise ValueError(f"a percentage must be between 0 and 100, not {percent}")


    def apply_discount(price_cents: int, percent: int) -> int:
        """``price_cents`` less ``percent`` percent, rounded to the nearest cent, halves up."""
        _check_percent(percent)
        if price_cents < 0:
            raise ValueError(f"a price cannot be negative ({price_cents})")
    ''') + BUGGY + textwrap.dedent('''\


    def apply_tax(net_cents: int, category: str) -> int:
        """``net_cents`` plus the category's tax, rounded to the nearest cent, halves up."""
        rate = TAX_RATES.get(category, 20)
        return (net_cents * (100 + rate) + 50) // 100


    def line_total(item: Item, quantity: int, percent: int = 0) -> int:
        """One line of a basket: the discounted unit price times the quantity."""
        if quantity < 0:
            raise ValueError(f"{item.sku}: a quantity cannot be negative ({quantity})")
        return apply_discount(item.price_cents, percent) * quantity


    def basket_total(lines: list[tuple[Item, int]], percent: int = 0) -> int:
        """A basket's total: the sum of its rounded lines (never a rounded sum)."""
        return sum(line_total(item, quantity, percent) for item, quantity in lines)


    def reorder_level(category: str) -> int:
        return REORDER_LEVELS.get(category, DEFAULT_REORDER_LEVEL)
    ''')

LOADER = textwrap.dedent('''\
    """Reads the catalogue CSV, checking every row (docs/design.md, "Loader")."""

    from __future__ import annotations

    import csv
    import re
    from pathlib import Path

    from stock.models import Item, Warehouse

    COLUMNS = ["sku", "name", "category", "price_cents", "quantity", "warehouse"]
    SKU = re.compile(r"^[A-Z]{3}-[0-9]+$")


    class LoaderError(ValueError):
        """A bad catalogue: the line and column say where."""


    def _int(value: str, line: int, column: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise LoaderError(f"line {line}: {column} is not a whole number: {value!r}") from None
        if number < 0:
            raise LoaderError(f"line {line}: {column} cannot be negative: {number}")
        return number


    def load(path: str | Path) -> tuple[list[Item], list[Warehouse]]:
        """The items and warehouses of a catalogue file; nothing if any row is bad."""
        items: dict[str, Item] = {}
        warehouses: dict[str, Warehouse] = {}
        with open(path, newline="", encoding="utf-8") as handle:
            reader = csv.reader(handle)
            header = next(reader, None)
            if header != COLUMNS:
                raise LoaderError(f"line 1: expected the columns {COLUMNS}, found {header}")
            for line, row in enumerate(reader, start=2):
                if len(row) != len(COLUMNS):
                    raise LoaderError(f"line {line}: {len(row)} columns, expected {len(COLUMNS)}")
                sku, name, category, price, quantity, warehouse = row
                if not SKU.match(sku):
                    raise LoaderError(f"line {line}: sku {sku!r} is not three capitals, a dash and digits")
                item = Item(sku, name, category, _int(price, line, "price_cents"))
                if sku in items and items[sku] != item:
                    raise LoaderError(f"line {line}: {sku} listed twice with different details")
                items[sku] = item
                warehouses.setdefault(warehouse, Warehouse(warehouse)).add(sku, _int(quantity, line, "quantity"))
        return list(items.values()), sorted(warehouses.values(), key=lambda w: w.name)
    ''')

REPORT = textwrap.dedent('''\
    """The weekly stock report (docs/design.md, "Stock levels")."""

    from __future__ import annotations

    import sys
    from collections import defaultdict

    from stock.loader import load
    from stock.models import Item, Warehouse, total_quantity
    from stock.pricing import reorder_level


    def money(cents: int) -> str:
        """Cents as ``12.34``."""
        return f"{cents // 100}.{cents % 100:02d}"


    def low_stock(items: list[Item], warehouses: list[Warehouse]) -> list[tuple[Item, int]]:
        """Items under their category's reorder level, fewest first."""
        low = [(item, total_quantity(warehouses, item.sku)) for item in items]
        low = [(item, n) for item, n in low if n < reorder_level(item.category)]
        return sorted(low, key=lambda pair: (pair[1], pair[0].sku))


    def most_valuable(items: list[Item], warehouses: list[Warehouse], n: int = 10) -> list[tuple[Item, int]]:
        """The ``n`` lines worth the most in stock (price times quantity)."""
        lines = [(item, item.value(total_quantity(warehouses, item.sku))) for item in items]
        return sorted(lines, key=lambda pair: (-pair[1], pair[0].sku))[:n]


    def per_category(items: list[Item], warehouses: list[Warehouse]) -> dict[str, tuple[int, int]]:
        """Units and value per category."""
        totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for item in items:
            quantity = total_quantity(warehouses, item.sku)
            totals[item.category][0] += quantity
            totals[item.category][1] += item.value(quantity)
        return {category: (units, value) for category, (units, value) in sorted(totals.items())}


    def per_warehouse(items: list[Item], warehouses: list[Warehouse]) -> dict[str, tuple[int, int]]:
        """Units and value per warehouse."""
        prices = {item.sku: item.price_cents for item in items}
        out = {}
        for warehouse in warehouses:
            value = sum(prices[sku] * n for sku, n in warehouse.quantities.items())
            out[warehouse.name] = (warehouse.total_units(), value)
        return out


    def render(items: list[Item], warehouses: list[Warehouse]) -> str:
        lines = ["# Weekly stock report", ""]
        low = low_stock(items, warehouses)
        lines.append(f"## Low stock ({len(low)} items)")
        lines += [f"- {item.sku} {item.name}: {n} left (reorder at {reorder_level(item.category)})"
                  for item, n in low]
        lines += ["", "## Most valuable lines"]
        lines += [f"- {item.sku} {item.name}: {money(value)}" for item, value in most_valuable(items, warehouses)]
        lines += ["", "## Per category", "", "| category | units | value |", "|---|---|---|"]
        lines += [f"| {c} | {u} | {money(v)} |" for c, (u, v) in per_category(items, warehouses).items()]
        lines += ["", "## Per warehouse", "", "| warehouse | units | value |", "|---|---|---|"]
        lines += [f"| {w} | {u} | {money(v)} |" for w, (u, v) in per_warehouse(items, warehouses).items()]
        return "\\n".join(lines) + "\\n"


    def main(argv: list[str]) -> int:
        if len(argv) != 1:
            print("usage: python3 -m stock.report CATALOGUE.csv", file=sys.stderr)
            return 2
        items, warehouses = load(argv[0])
        sys.stdout.write(render(items, warehouses))
        return 0


    if __name__ == "__main__":
        raise SystemExit(main(sys.argv[1:]))
    ''')

TEST_HEADER = textwrap.dedent('''\
    import sys
    import unittest
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    ''')


def _discount_cases() -> list[tuple[int, int, int]]:
    """(price, percent, expected) computed by hand's rule: nearest cent, halves up."""
    cases = []
    for price in (199, 250, 999, 1001, 1250, 4999, 12345):
        for percent in (5, 15, 25, 33):
            cases.append((price, percent, (price * (100 - percent) + 50) // 100))
    return cases


def _test_pricing() -> str:
    body = TEST_HEADER + textwrap.dedent('''\
        from stock.models import Item
        from stock.pricing import apply_discount, apply_tax, basket_total, line_total, reorder_level


        class DiscountTest(unittest.TestCase):
            """Prices and percentages worked out by hand: the nearest cent, halves up."""
        ''')
    for price, percent, expected in _discount_cases():
        body += (f"\n    def test_{price}_less_{percent}_percent(self):\n"
                 f"        self.assertEqual(apply_discount({price}, {percent}), {expected})\n")
    body += textwrap.dedent('''\

            def test_no_discount_keeps_the_price(self):
                self.assertEqual(apply_discount(1999, 0), 1999)

            def test_full_discount_is_free(self):
                self.assertEqual(apply_discount(1999, 100), 0)

            def test_bad_percent(self):
                with self.assertRaises(ValueError):
                    apply_discount(100, 101)


        class TaxTest(unittest.TestCase):
            def test_toys_five_percent(self):
                self.assertEqual(apply_tax(1000, "toys"), 1050)

            def test_garden_rounds_half_up(self):
                self.assertEqual(apply_tax(5, "garden"), 6)

            def test_unknown_category_twenty_percent(self):
                self.assertEqual(apply_tax(1000, "unknown"), 1200)


        class BasketTest(unittest.TestCase):
            def setUp(self):
                self.hammer = Item("HAR-1000", "hammer", "hardware", 1250)
                self.rake = Item("GAR-1007", "rake", "garden", 999)

            def test_sum_of_rounded_lines(self):
                lines = [(self.hammer, 2), (self.rake, 3)]
                self.assertEqual(basket_total(lines, 15), 2 * apply_discount(1250, 15) + 3 * apply_discount(999, 15))

            def test_line_total(self):
                self.assertEqual(line_total(self.rake, 4), 3996)

            def test_negative_quantity(self):
                with self.assertRaises(ValueError):
                    line_total(self.rake, -1)

            def test_reorder_levels(self):
                self.assertEqual((reorder_level("hardware"), reorder_level("toys")), (30, 20))


        if __name__ == "__main__":
            unittest.main()
        ''')
    return body


def _test_report() -> str:
    body = TEST_HEADER + textwrap.dedent('''\
        from stock.loader import LoaderError, load
        from stock.models import Item, Warehouse, stock_value, total_quantity
        from stock.report import low_stock, money, most_valuable, per_category, per_warehouse, render

        CATALOGUE = Path(__file__).resolve().parents[1] / "data" / "items.csv"


        class ReportTest(unittest.TestCase):
            @classmethod
            def setUpClass(cls):
                cls.items, cls.warehouses = load(CATALOGUE)

            def test_money(self):
                self.assertEqual([money(5), money(1234), money(100)], ["0.05", "12.34", "1.00"])

            def test_low_stock_sorted_fewest_first(self):
                counts = [n for _, n in low_stock(self.items, self.warehouses)]
                self.assertEqual(counts, sorted(counts))

            def test_most_valuable_is_ten_lines(self):
                self.assertEqual(len(most_valuable(self.items, self.warehouses)), 10)

            def test_render_has_every_section(self):
                text = render(self.items, self.warehouses)
                for title in ("Low stock", "Most valuable", "Per category", "Per warehouse"):
                    self.assertIn(title, text)
        ''')
    items = _items()
    for category in CATEGORIES:
        rows = [r for r in items if r[2] == category]
        units = sum(r[4] for r in rows)
        value = sum(r[3] * r[4] for r in rows)
        body += (f"\n    def test_{category}_totals(self):\n"
                 f"        self.assertEqual(per_category(self.items, self.warehouses)[{category!r}], "
                 f"({units}, {value}))\n")
    for warehouse in WAREHOUSES:
        rows = [r for r in items if r[5] == warehouse]
        units = sum(r[4] for r in rows)
        body += (f"\n    def test_{warehouse}_units(self):\n"
                 f"        self.assertEqual(per_warehouse(self.items, self.warehouses)[{warehouse!r}][0], {units})\n")
    for sku, _name, _category, _price, quantity, _w in items[:120]:
        body += (f"\n    def test_{sku.replace('-', '_').lower()}_in_stock(self):\n"
                 f"        self.assertEqual(total_quantity(self.warehouses, {sku!r}), {quantity})\n")
    total = sum(r[3] * r[4] for r in items)
    body += textwrap.dedent(f'''\

        def test_stock_value(self):
            self.assertEqual(stock_value(self.items, self.warehouses), {total})


    class LoaderTest(unittest.TestCase):
        def write(self, text):
            import tempfile
            handle = tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False)
            handle.write(text)
            handle.close()
            self.addCleanup(Path(handle.name).unlink)
            return handle.name

        def test_bad_price_names_line_and_column(self):
            path = self.write("sku,name,category,price_cents,quantity,warehouse\\nTOY-1,ball,toys,x,1,north\\n")
            with self.assertRaisesRegex(LoaderError, "line 2: price_cents"):
                load(path)

        def test_bad_sku(self):
            path = self.write("sku,name,category,price_cents,quantity,warehouse\\ntoy1,ball,toys,1,1,north\\n")
            with self.assertRaisesRegex(LoaderError, "line 2: sku"):
                load(path)

        def test_warehouse_add_remove(self):
            w = Warehouse("north")
            w.add("TOY-1", 5)
            w.remove("TOY-1", 2)
            self.assertEqual(w.quantity("TOY-1"), 3)
            with self.assertRaises(ValueError):
                w.remove("TOY-1", 4)

        def test_negative_price(self):
            with self.assertRaises(ValueError):
                Item("TOY-1", "ball", "toys", -1)


    if __name__ == "__main__":
        unittest.main()
    ''')
    return body


PYPROJECT = textwrap.dedent('''\
    [project]
    name = "stock"
    version = "0.4.0"
    requires-python = ">=3.9"
    description = "A shop's catalogue: prices in cents, stock per warehouse, a weekly report."
    ''')


def files(fixed: bool = False) -> dict[str, str]:
    """Every file of the repository as the task finds it (``fixed``: as it leaves it)."""
    pricing = PRICING_BUGGY.replace(BUGGY, FIXED) if fixed else PRICING_BUGGY
    return {
        ".gitignore": "__pycache__/\n*.pyc\n.aider*\n",
        "README.md": README,
        "CHANGELOG.md": CHANGELOG,
        "pyproject.toml": PYPROJECT,
        "docs/design.md": DESIGN,
        "data/items.csv": _csv(),
        "src/stock/__init__.py": INIT,
        "src/stock/models.py": MODELS,
        "src/stock/loader.py": LOADER,
        "src/stock/pricing.py": pricing,
        "src/stock/report.py": REPORT,
        "tests/__init__.py": "",
        "tests/test_pricing.py": _test_pricing(),
        "tests/test_report.py": _test_report(),
    }


GIT_ENV = {"GIT_AUTHOR_NAME": "Dana Shop", "GIT_AUTHOR_EMAIL": "dana@stock.example",
           "GIT_COMMITTER_NAME": "Dana Shop", "GIT_COMMITTER_EMAIL": "dana@stock.example",
           "GIT_CONFIG_NOSYSTEM": "1"}


def _git(repo: Path, *args: str, date: str | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_ENV, HOME=str(repo.parent), GIT_CONFIG_GLOBAL=os.devnull)
    if date:
        env.update(GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date)
    done = subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=True)
    return done.stdout


def make_repo(repo: Path) -> Path:
    """The repository at ``repo`` (created): three commits, the last one bringing the bug."""
    repo.mkdir(parents=True, exist_ok=False)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "config", "user.name", GIT_ENV["GIT_AUTHOR_NAME"])
    _git(repo, "config", "user.email", GIT_ENV["GIT_AUTHOR_EMAIL"])
    final = files()
    # 0.3.0: discounts rounded with floats (the right results, by luck of the inputs)
    earlier = dict(final)
    earlier["src/stock/pricing.py"] = final["src/stock/pricing.py"].replace(
        BUGGY, "    return round(price_cents * (100 - percent) / 100 + 1e-9)\n")
    earlier["CHANGELOG.md"] = final["CHANGELOG.md"].split("## 0.3.0", 1)[0].split("## 0.4.0", 1)[0] \
        + "## 0.3.0" + final["CHANGELOG.md"].split("## 0.3.0", 1)[1]
    first = {k: v for k, v in earlier.items() if k not in ("src/stock/report.py", "tests/test_report.py")}
    for stage, when, message in ((first, "2026-03-02T10:00:00+00:00", "stock: items, warehouses, loader, pricing"),
                                 (earlier, "2026-05-11T15:30:00+00:00", "report: the weekly stock report (0.3.0)"),
                                 (final, "2026-11-20T09:12:00+00:00",
                                  "pricing: discounts without floats\n\nInteger arithmetic only, as the design asks.")):
        for path, text in stage.items():
            target = repo / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", message, date=when)
    return repo


def diff(repo: Path) -> str:
    """What the agent changed: ``git diff`` of the work tree, untracked files included
    (added with intent-to-add first, so a file the agent created shows too)."""
    _git(repo, "add", "-N", ".")
    return _git(repo, "diff", "--no-color", "--no-ext-diff")
