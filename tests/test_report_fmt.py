"""scaletrain/fmt.py: numbers as people read them, the one formatting module; missing is '-', never 0."""

from __future__ import annotations

import pytest

from scaletrain import fmt


def test_formats():
    assert fmt.duration(0.0412) == "41.2 ms" and fmt.duration(2.5) == "2.50 s" and fmt.duration(None) == "-"
    assert fmt.hms(3725.4) == "1:02:05" and fmt.hms(40) == "0:00:40"
    assert fmt.share(0.4199) == "42.0%" and fmt.share(0.4199, 0) == "42%"
    assert fmt.change(-0.41990) == "-42.0%" and fmt.change(0.1, 0) == "+10%" and fmt.change(None) == "-"
    assert fmt.size(1_090_000) == "1.0 MiB" and fmt.size(3 * 2**30) == "3.0 GiB" and fmt.size(10) == "10 B"
    assert fmt.size(65.4 * 2**40) == "65.4 TiB"  # a 100,000 px image's dataset: never 66943.5 GiB
    assert fmt.rate(876.71) == "877/s" and fmt.factor(1.818) == "1.82x"
    assert fmt.rate(0.434) == "0.434/s" and fmt.rate(12.34) == "12.3/s" and fmt.rate(1234.4, "samples") == \
        "1,234 samples/s"  # a slow run's rate is never rounded to 0
    assert fmt.number(0.0431) == "0.0431" and fmt.number(99.4) == "99.4" and fmt.number(None) == "-"


def test_times_in_milliseconds_and_in_the_unit_that_shows_them():
    assert fmt.ms(0.0123) == "12.3 ms" and fmt.ms(0.0123, unit=False) == "12.3" and fmt.ms(None) == "-"
    assert fmt.ms_sig(0.0123) == "12.3 ms" and fmt.ms_sig(2e-7) == "2.0e-04 ms" and fmt.ms_sig(1.234e-5, unit=False) \
        == "0.0123" and fmt.ms_sig(None) == "-"  # one layer's time: three significant digits over many decades
    assert (fmt.span(1.5), fmt.span(0.0123), fmt.span(4.2e-5), fmt.span(-0.002, "+")) == \
        ("1.500 s", "12.3 ms", "42 us", "-2.0 ms")


def test_value_by_kind():
    assert fmt.value("seconds", 40) == "40.00 s" and fmt.value("time", 0.002) == "2.0 ms"
    assert all(fmt.value(kind, None) == "-" for kind in ("time", "seconds", "rate", "share", "factor"))
    with pytest.raises(ValueError):
        fmt.value("furlongs", 1.0)
