r"""Hand-labelled math answers in the formats real math models write, for comparing checkers.

Each case is a model response, the ground truth as a MATH/GSM8K data set stores it, and the
verdict a careful human grader gives (`correct`). The responses follow what instruction-tuned
models produce on MATH (a final `\boxed{...}`, LaTeX fractions, intervals, units) and GSM8K
(working then `#### 42`, or a last sentence with the number). Verdicts follow MATH's grading
convention: the exact value is asked for, so a decimal approximation of an irrational number is
wrong; units, a variable name (`x = 5`), `\left`/`\right` and element order in a set do not
matter. bench/math_verify_agreement.py scores `math_answer` and `math_verify` on them, and
tests/test_math_verify.py checks the measured verdicts.
"""

from __future__ import annotations

from typing import NamedTuple


class Case(NamedTuple):
    name: str  # unique, says the format under test
    response: str  # the model's text
    gt_answer: str  # the ground truth as the data set stores it
    correct: bool  # the verdict by hand


GSM8K_SOLUTION = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"

CASES: tuple[Case, ...] = (
    # fractions and decimals
    Case("frac_vs_decimal", r"The probability is $\frac{3}{4}$, so the answer is $\boxed{\frac{3}{4}}$.", "0.75", True),
    Case("decimal_vs_frac", r"So $p = 0.75$. \boxed{0.75}", r"\frac{3}{4}", True),
    Case("dfrac_vs_slash", r"Therefore the ratio is \boxed{\dfrac{3}{4}}.", "3/4", True),
    Case("slash_vs_frac", r"The answer is \boxed{1/3}.", r"\frac13", True),
    Case("wrong_fraction", r"Thus the probability is \boxed{\frac{2}{3}}.", r"\frac{3}{4}", False),
    Case("rounded_decimal", r"This is about \boxed{0.333}.", r"\frac{1}{3}", False),
    Case("six_decimals", r"This is about \boxed{0.333333}.", r"\frac{1}{3}", False),
    Case("negative_frac_vs_decimal", r"The slope is \boxed{-\frac{1}{2}}.", "-0.5", True),
    Case("negative_numerator", r"So $m = \boxed{\frac{-1}{2}}$.", r"-\frac{1}{2}", True),
    Case("wrong_sign", r"The slope is \boxed{\frac{1}{2}}.", r"-\frac12", False),
    # radicals and pi
    Case("sqrt_same", r"The side length is \boxed{\sqrt{2}}.", r"\sqrt{2}", True),
    Case("sqrt_no_braces", r"The side length is \boxed{\sqrt 2}.", r"\sqrt{2}", True),
    Case("rationalised", r"Hence $\sin 45^\circ = \boxed{\frac{\sqrt{2}}{2}}$.", r"\frac{1}{\sqrt{2}}", True),
    Case("simplified_radical", r"The diagonal is \boxed{2\sqrt{2}}.", r"\sqrt{8}", True),
    Case("wrong_radical", r"The side length is \boxed{\sqrt{3}}.", r"\sqrt{2}", False),
    Case("pi_same", r"The circumference is \boxed{2\pi}.", r"2\pi", True),
    Case("pi_approximated", r"The circumference is about \boxed{6.28}.", r"2\pi", False),
    Case("wrong_pi", r"The area is \boxed{4\pi}.", r"2\pi", False),
    # intervals, points, sets
    Case("interval_spacing", r"The domain is \boxed{[2, 5)}.", "[2,5)", True),
    Case("interval_infinity", r"So $x \in \boxed{(-\infty, 3]}$.", r"(-\infty,3]", True),
    Case("interval_wrong_bracket", r"The solution set is \boxed{(-\infty, 3)}.", r"(-\infty, 3]", False),
    Case("interval_wrong_end", r"The domain is \boxed{[2,5]}.", "[2, 5)", False),
    Case("point_same", r"The intersection is at \boxed{(3, -1)}.", "(3,-1)", True),
    Case("point_left_right", r"The center is $\boxed{\left( 3, -1 \right)}$.", "(3,-1)", True),
    Case("point_swapped", r"The intersection is at \boxed{(-1, 3)}.", "(3,-1)", False),
    Case("set_reordered", r"The roots form the set \boxed{\{1, 2, 3\}}.", r"\{3, 2, 1\}", True),
    Case("solutions_reordered", r"The solutions are $x = -2$ and $x = 3$, so \boxed{-2, 3}.", "3, -2", True),
    Case("solutions_one_wrong", r"The solutions are \boxed{-2, 4}.", "3, -2", False),
    Case("extra_solution", r"The solutions are \boxed{2, 3}.", "2", False),
    Case("set_missing_element", r"The set is \boxed{\{1, 2\}}.", r"\{1, 2, 3\}", False),
    # percentages, separators, units, currency
    Case("percent_sign", r"The discount is \boxed{25\%}.", "25", True),
    Case("wrong_percent", r"The discount is \boxed{40\%}.", "25", False),
    Case("thousands_separator", r"The total is \boxed{1,000}.", "1000", True),
    Case("latex_thousands", r"There are \boxed{1{,}000{,}000} ways.", "1000000", True),
    Case("units_text", r"The perimeter is \boxed{5 \text{ cm}}.", "5", True),
    Case("wrong_units_value", r"The perimeter is \boxed{12 \text{ cm}}.", "5", False),
    Case("wrong_unit", r"The length is \boxed{5 \text{ m}}.", r"5 \text{ cm}", False),
    Case("wrong_thousands", r"The total is \boxed{10,000}.", "1000", False),
    Case("degrees", r"Each angle measures \boxed{30^\circ}.", "30", True),
    Case("dollar_sign", r"She earns \boxed{\$18} per day.", "18", True),
    # equations and expressions
    Case("equation_vs_value", r"Solving, we get \boxed{x = 5}.", "5", True),
    Case("equation_wrong_value", r"Solving, we get \boxed{x = 6}.", "5", False),
    Case("inline_equation_no_box", r"Subtracting 3 from both sides, $2x = 10$, so $x = 5$.", "5", True),
    Case("line_same", r"The line is \boxed{y = 2x + 3}.", "y=2x+3", True),
    Case("line_wrong", r"The line is \boxed{y = 3x + 2}.", "y=2x+3", False),
    Case("expanded_polynomial", r"Expanding, \boxed{x^2 + 2x + 1}.", "(x+1)^2", True),
    Case("complex_reordered", r"So $z = \boxed{4i + 3}$.", "3+4i", True),
    Case("scientific_notation", r"The population is \boxed{3 \times 10^{5}}.", "300000", True),
    Case("scientific_negative_exponent", r"The concentration is \boxed{3.2 \times 10^{-3}}.", "0.0032", True),
    Case("scientific_wrong_exponent", r"The population is \boxed{3 \times 10^{4}}.", "300000", False),
    Case("inequality_vs_interval", r"Therefore \boxed{x > 2}.", r"(2, \infty)", True),
    # GSM8K: working, then '#### n' or a last sentence; the gold is a full GSM8K solution
    Case("gsm8k_hashes", "In May she sold 48 / 2 = 24 clips.\nAltogether 48 + 24 = 72 clips.\n#### 72", GSM8K_SOLUTION, True),
    Case("gsm8k_wrong", "In May she sold 48 * 2 = 96 clips.\nAltogether 48 + 96 = 144 clips.\n#### 144", GSM8K_SOLUTION, False),
    Case("gsm8k_sentence", "48 / 2 = 24 clips in May, and 48 + 24 = 72 clips in total. The answer is 72.", "72", True),
    Case("gsm8k_thousands_no_box", "He pays 5 * 250 = 1,250 dollars.\nHe pays $1,250 in total.", "#### 1250", True),
    Case("plain_fraction_sentence", "Dividing, the answer is 3/4.", "0.75", True),
    # several boxes: the last one is the final answer; no answer at all
    Case("boxes_last_right", r"One face has area \boxed{12}. The six faces have area \boxed{72}.", "72", True),
    Case("boxes_comma_last_right", r"One face has area \boxed{12}, so the six faces have area \boxed{72}.", "72", True),
    Case("boxes_last_wrong", r"The surface area is \boxed{72}. Wait, one face only: \boxed{12}.", "72", False),
    Case("no_answer", "Let me think about this step by step. First we need the area of one face", "72", False),
)
