"""The chapter 3 checkers accept right answers and diagnose the typical wrong ones."""

from __future__ import annotations

import math

import pytest
import torch

from lib.exercises._common import ExerciseError
from lib.exercises.positions import (
    check_alibi_head_slopes,
    check_rope_rotate_pairs,
    check_sinusoidal_table,
    check_t5_bucket,
)
from lib.positions import (
    alibi_slopes,
    rotary_interleaved,
    sinusoidal_positions,
    t5_relative_position_bucket,
)

# ---------------------------------------------------------------- exercise 1


def _table(n: int, d: int, *, swap: bool = False, exponent_i: bool = False, blocks: bool = False):
    pos = torch.arange(n, dtype=torch.float64)[:, None]
    pair = torch.arange(d // 2, dtype=torch.float64)[None, :]
    angle = pos / 10000 ** ((pair if exponent_i else 2 * pair) / d)
    first, second = (angle.cos(), angle.sin()) if swap else (angle.sin(), angle.cos())
    if blocks:
        return torch.cat((first, second), dim=-1)
    return torch.stack((first, second), dim=-1).reshape(n, d)


def test_sinusoidal_checker_accepts_the_lib_and_a_float64_answer():
    assert check_sinusoidal_table(sinusoidal_positions)
    assert check_sinusoidal_table(_table)


def test_sinusoidal_checker_reports_not_attempted():
    def stub(n, d):
        raise NotImplementedError

    assert check_sinusoidal_table(stub) is False


@pytest.mark.parametrize(
    ("mistake", "message"),
    [
        ({"swap": True}, "sin and cos are swapped"),
        ({"exponent_i": True}, "exponent uses the pair index i"),
        ({"blocks": True}, "all the sines first"),
    ],
)
def test_sinusoidal_checker_names_the_mistake(mistake, message):
    with pytest.raises(ExerciseError, match=message):
        check_sinusoidal_table(lambda n, d: _table(n, d, **mistake))


def test_sinusoidal_checker_catches_wrong_shape_and_other_errors():
    with pytest.raises(ExerciseError, match=r"has shape \(50, 8\), expected \(50, 16\)"):
        check_sinusoidal_table(lambda n, d: _table(n, d // 2))
    with pytest.raises(ExerciseError, match="differs from the reference"):
        check_sinusoidal_table(lambda n, d: _table(n, d) + 0.01)


# ---------------------------------------------------------------- exercise 2


def _rotate(x, positions, sign=1.0, base=10000.0, half_split=False):
    d = x.shape[-1]
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = sign * positions.double()[:, None] * theta
    if half_split:
        a, b = x[:, : d // 2], x[:, d // 2 :]
    else:
        a, b = x[:, 0::2], x[:, 1::2]
    new_a, new_b = a * angle.cos() - b * angle.sin(), a * angle.sin() + b * angle.cos()
    if half_split:
        return torch.cat((new_a, new_b), dim=-1)
    return torch.stack((new_a, new_b), dim=-1).reshape(x.shape)


def test_rope_checker_accepts_a_right_answer_and_the_complex_reference():
    assert check_rope_rotate_pairs(_rotate)

    def via_lib(x, positions):  # rotary_interleaved works on consecutive positions
        return torch.stack(
            [rotary_interleaved(row[None], int(p))[0] for row, p in zip(x, positions)]
        )

    assert check_rope_rotate_pairs(via_lib)


def test_rope_checker_catches_the_wrong_direction():
    with pytest.raises(ExerciseError, match="rotation goes the wrong way"):
        check_rope_rotate_pairs(lambda x, p: _rotate(x, p, sign=-1.0))


def test_rope_checker_catches_the_half_split_pairing():
    with pytest.raises(ExerciseError, match="half-split"):
        check_rope_rotate_pairs(lambda x, p: _rotate(x, p, half_split=True))


def test_rope_checker_catches_a_wrong_frequency_and_in_place_edits():
    with pytest.raises(ExerciseError, match="pair i turns by position"):
        check_rope_rotate_pairs(lambda x, p: _rotate(x, p, base=100.0))

    def in_place(x, positions):
        x.mul_(1.0)
        x[0, 0] += 1.0
        return _rotate(x, positions)

    with pytest.raises(ExerciseError, match="modified its input"):
        check_rope_rotate_pairs(in_place)


def test_rope_checker_catches_a_non_rotation_and_a_shifted_position():
    def forgets_sin(x, positions):  # (a cos, b cos): not a rotation, lengths shrink
        d = x.shape[-1]
        theta = 10000 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
        cos = (positions.double()[:, None] * theta).cos()
        return torch.stack((x[:, 0::2] * cos, x[:, 1::2] * cos), dim=-1).reshape(x.shape)

    with pytest.raises(ExerciseError, match="a rotation keeps lengths"):
        check_rope_rotate_pairs(forgets_sin)
    with pytest.raises(ExerciseError, match="position 0 should come back unchanged"):
        check_rope_rotate_pairs(lambda x, p: _rotate(x, p + 1))


# ---------------------------------------------------------------- exercise 3


def test_alibi_checker_accepts_the_lib_and_a_list():
    assert check_alibi_head_slopes(alibi_slopes)
    assert check_alibi_head_slopes(lambda n: alibi_slopes(n).tolist())


def test_alibi_checker_catches_the_naive_rule_for_non_powers_of_two():
    naive = lambda n: torch.tensor([2 ** (-8 * h / n) for h in range(1, n + 1)])
    with pytest.raises(ExerciseError, match="n_heads=6, not a power of two"):
        check_alibi_head_slopes(naive)


def test_alibi_checker_catches_sorted_slopes_and_wrong_start():
    with pytest.raises(ExerciseError, match="right values in the wrong order"):
        check_alibi_head_slopes(lambda n: alibi_slopes(n).sort(descending=True).values)
    with pytest.raises(ExerciseError, match=r"alibi_slopes\(8\) differs"):
        check_alibi_head_slopes(lambda n: torch.tensor([2 ** (-8 * h / n) for h in range(n)]))
    with pytest.raises(ExerciseError, match=r"has shape \(7,\), expected \(8,\)"):
        check_alibi_head_slopes(lambda n: alibi_slopes(n)[:-1])


# ---------------------------------------------------------------- exercise 4


def _bucket(r, bidirectional, num_buckets, max_distance):
    return int(
        t5_relative_position_bucket(torch.tensor(r), bidirectional, num_buckets, max_distance)
    )


def test_t5_checker_accepts_the_lib():
    assert check_t5_bucket(_bucket)


def test_t5_checker_catches_swapped_directions():
    with pytest.raises(ExerciseError, match="past and future are swapped"):
        check_t5_bucket(lambda r, b, n, m: _bucket(-r, b, n, m))


def test_t5_checker_catches_missing_saturation():
    def no_clamp(r, bidirectional, num_buckets, max_distance):
        n = abs(r) if bidirectional else max(-r, 0)
        offset = num_buckets // 2 if bidirectional and r > 0 else 0
        per_side = num_buckets // 2 if bidirectional else num_buckets
        exact = per_side // 2
        if n < exact:
            return offset + n
        return (
            offset
            + exact
            + int(math.log(n / exact) / math.log(max_distance / exact) * (per_side - exact))
        )

    with pytest.raises(ExerciseError, match="saturate in the last bucket"):
        check_t5_bucket(no_clamp)


def test_t5_checker_points_at_the_first_wrong_distance():
    def off_by_one(r, bidirectional, num_buckets, max_distance):
        right = _bucket(r, bidirectional, num_buckets, max_distance)
        return right + 1 if r == -3 else right

    with pytest.raises(ExerciseError, match="relative_position=-3 you return bucket 4, expected 3"):
        check_t5_bucket(off_by_one)
