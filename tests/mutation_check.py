"""Mutation check: every theorem, lemma and proposition the suite checks has a test that can fail.

Usage (from the repository root)::

    python3 tests/mutation_check.py            # all mutations
    python3 tests/mutation_check.py --list     # print the table and exit
    python3 tests/mutation_check.py --baseline # first run the named tests unmutated
    python3 tests/mutation_check.py --match vattention  # only the rows whose statement says so
    python3 tests/mutation_check.py --jobs 1   # one mutation at a time (default: one per core)

For each row of ``MUTATIONS`` below -- (statement, file, exact old text, new text, tests) -- the
check copies ``approxlab/``, ``tests/`` and ``pyproject.toml`` into a temporary directory,
replaces the old text (which must occur exactly once) by the new text in that copy, and runs
only the named tests there with pytest (cwd = the copy, so the copy is what is imported). A
mutation is *caught* when pytest reports failed tests (exit status 1); a collection or usage
error (a renamed test, a mutation that does not import) is not a catch. ``--jobs`` copies run
side by side, each taking the next mutation (the verdicts print in the table's order). Before any mutation
every named test must be collected from the unmutated copy (``--baseline`` also runs them; CI
runs the whole suite first anyway). The last line printed is ``N caught, M missed``; the exit
status is non-zero if any mutation is missed, if an old text is not found exactly once (a
stale row must not pass silently) or if the baseline fails.

The table is plain data so that moving code (e.g. ``approxlab/sketch.py`` into
``approxlab/linalg/``) only means editing a path here.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import queue
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# (statement, file relative to the repository root, exact old text, new text, tests to run)
MUTATIONS = [
    (
        "Nystromformer Eq. (5) / supplement Lemma 1: iteration coefficients (7I -> 6I)",
        "approxlab/linalg/pinv.py",
        "mz @ (7 * eye - mz)",
        "mz @ (6 * eye - mz)",
        ["tests/test_nystromformer.py::test_lemma1_third_order_convergence_to_moore_penrose"],
    ),
    (
        "Nystromformer Eq. (5) / Lemma 1 hypothesis: initial scaling ||M||_1 ||M||_inf -> ||M||_inf^2",
        "approxlab/linalg/pinv.py",
        "z0 = mt / col / row",
        "z0 = mt / row / row",
        ["tests/test_nystromformer.py::test_lemma1_initial_scaling_on_column_heavy_cores"],
    ),
    (
        "Nystromformer supplement Lemma 2: segment means (all landmarks -> exact attention)",
        "approxlab/methods/nystromformer.py",
        "reshape(*batch, num_landmarks - remainder, length, p).mean(-2)",
        "reshape(*batch, num_landmarks - remainder, length, p).sum(-2) / (length + 1)",
        ["tests/test_nystromformer.py::test_lemma2_all_landmarks_recover_softmax_attention"],
    ),
    (
        "Nystromformer supplement Proposition 1: F row-stochastic (softmax over keys)",
        "approxlab/methods/nystromformer.py",
        "softmax_matrix(q, k_landmarks),",
        "softmax_matrix(k_landmarks, q).transpose(-1, -2),",
        ["tests/test_nystromformer.py::test_proposition1_linf_error_bound"],
    ),
    (
        "Skyformer Lemma 1 / Eq. (1): diagonal scaling exp(|x|^2 / (2 sqrt p)) (2 -> 2.000001)",
        "approxlab/kernels.py",
        "return (x * x).sum(-1) / (2.0 * math.sqrt(x.shape[-1]))",
        "return (x * x).sum(-1) / (2.000001 * math.sqrt(x.shape[-1]))",
        ["tests/test_skyformer.py::test_lemma1_softmax_kernel_is_psd"],
    ),
    (
        "Skyformer Lemma 3: D_M = diag((M + gamma I) 1) (gamma dropped from D_M)",
        "approxlab/linalg/cores.py",
        "row_sums = w.sum(-1)",
        "row_sums = w.sum(-1) - gamma",
        ["tests/test_skyformer.py::test_lemma3_scaled_core_singular_values_in_unit_interval"],
    ),
    (
        "Skyformer Sec. 4.2 / Appendix D: completion inequality and C~_bar <= C_bar (Nystrom scaled by 1.001)",
        "approxlab/sketch.py",
        "return half.transpose(-1, -2) @ half",
        "return 1.001 * (half.transpose(-1, -2) @ half)",
        ["tests/test_skyformer.py::test_completion_inequality_and_loewner_order"],
    ),
    (
        "Skyformer Theorem 2 / Lemma C.2: sample size (28/3)(s/beta) log(2N/delta) divided by 8",
        "tests/test_skyformer.py",
        "28 / 3 * stable_rank / beta",
        "28 / 3 / 8 * stable_rank / beta",
        [
            "tests/test_skyformer.py::test_theorem2_lemma_c2_sample_size_bites",
            "tests/test_skyformer.py::test_theorem2_conclusion_fails_below_lemma_c2_size_coupon_collector",
        ],
    ),
    (
        "Skyformer Theorem 2: ridge leverage scores l_i = [K (K + lam I)^{-1}]_ii (lam -> 2 lam)",
        "approxlab/leverage/dense.py",
        "return evals / (evals + lam), evecs, lam",
        "return evals / (evals + 2 * lam), evecs, lam",
        ["tests/test_leverage.py::test_exact_scores_in_unit_interval_and_sum_to_statistical_dimension"],
    ),
    (
        "Skyformer Sec. 4.5 remark: Lemma 3's gamma keeps the core's gradients bounded (gamma dropped)",
        "approxlab/linalg/cores.py",
        "w = 0.5 * m + 0.5 * m.transpose(-1, -2) + gamma * eye",
        "w = 0.5 * m + 0.5 * m.transpose(-1, -2) + 0.0 * gamma * eye",
        ["tests/test_skyformer.py::test_section45_unscaled_core_gradients_explode_lemma3_scaling_keeps_them_bounded"],
    ),
    (
        "Verma Eqs. (7)-(8), (10): core A_s^+ (I - delta A_s^+) (sign of delta)",
        "approxlab/methods/spectral_shifting.py",
        "u = inverse - delta[..., None, None] * squared_inverse",
        "u = inverse + delta[..., None, None] * squared_inverse",
        ["tests/test_spectral_shifting.py::test_eq8_core_minimises_landmark_objective_for_its_delta"],
    ),
    (
        "Verma Sec. 7, Eq. (12): B row-stochastic (softmax over keys)",
        "approxlab/methods/nystromformer.py",
        "masked_softmax_matrix(q_landmarks, k, key_mask),",
        "softmax_matrix(k, q_landmarks).transpose(-1, -2),",
        ["tests/test_spectral_shifting.py::test_section7_error_bound"],
    ),
    (
        "Wang, Luo & Zhang closed form / Verma Lemma 1: delta^ss = (tr K - tr(C^+ K C)) / (n - rank C)",
        "approxlab/methods/spectral_shifting.py",
        "(trace_k - trace_projected) / deficiency.clamp_min(1.0)",
        "(trace_k - trace_projected) / (deficiency + 1).clamp_min(1.0)",
        ["tests/test_spectral_shifting.py::test_lemma1_shifted_low_rank_recovered_exactly"],
    ),
    (
        "YOSO Eq. (2): collision probability (1 - arccos(c)/pi)^tau (exponent tau -> tau + 1)",
        "approxlab/lsh.py",
        "/ math.pi) ** tau",
        "/ math.pi) ** (tau + 1)",
        ["tests/test_yoso.py::test_collision_probability_of_tau_hyperplanes_monte_carlo"],
    ),
    (
        "Performer Lemma 1: positive random features exp(w^T x - |x|^2 / 2) are unbiased (1/2 -> 0.45)",
        "approxlab/methods/performer.py",
        ".sub_(0.5 * (x * x).sum(-1, keepdim=True))",
        ".sub_(0.45 * (x * x).sum(-1, keepdim=True))",
        ["tests/test_performer.py::test_random_features_are_unbiased_for_the_softmax_kernel"],
    ),
    (
        "performer-lra: the authors' double scaling, FAVOR+ for exp(q^T k / p) (p^-1/2 -> p^-1/4)",
        "approxlab/methods/performer_lra.py",
        "scale = p ** -0.5",
        "scale = p ** -0.25",
        ["tests/test_performer_lra.py::test_it_estimates_softmax_of_qk_over_p_not_over_sqrt_p"],
    ),
    (
        "Linformer: E[P^T P] = I for the random projection (scale 1/sqrt(k) -> 1/k)",
        "approxlab/methods/linformer.py",
        "r.div_(math.sqrt(num_features))",
        "r.div_(num_features)",
        ["tests/test_informer_linformer.py::test_linformer_projection_is_isotropic_in_expectation"],
    ),
    (
        "Padding invariance: Nystromformer's query landmarks over real tokens only (padded queries averaged in)",
        "approxlab/methods/nystromformer.py",
        "segment_means(q, num_landmarks, query_mask(key_mask, q, k))",
        "segment_means(q, num_landmarks)",
        ["tests/test_masking.py::test_padding_cannot_leak_into_real_rows"],
    ),
    (
        "Padding invariance: Skyformer's columns drawn among real rows of [Q; K] only (padded rows drawable)",
        "approxlab/sketch.py",
        ".masked_fill_(~row_mask, 2.0)",
        ".masked_fill_(~row_mask, 0.5)",
        ["tests/test_masking.py::test_padding_cannot_leak_into_real_rows"],
    ),
    (
        "Higham Eq. (3.5): float32 dot-product rounding radius of YOSO's certified signs (radius / 100)",
        "approxlab/lsh.py",
        "radius = 1.01 * (x.shape[-1] + 2)",
        "radius = 0.0101 * (x.shape[-1] + 2)",
        ["tests/test_yoso.py::test_hash_codes_keep_float64_signs_below_float32_resolution"],
    ),
    (
        "Performer Sec. 2.6, unidirectional FAVOR+: row i sums keys j <= i (diagonal dropped: j < i)",
        "approxlab/methods/performer.py",
        "local = (query_features @ key_features.transpose(-1, -2)).tril()",
        "local = (query_features @ key_features.transpose(-1, -2)).tril(-1)",
        ["tests/test_causal_methods.py::test_causal_performer_is_masked_dense_favor_with_the_same_features"],
    ),
    (
        "Informer, causal ProbSparse: lazy rows are the cumulative mean of V (1/(i+1) -> 1/(i+2))",
        "approxlab/methods/informer.py",
        "self._weights = 1.0 / positions if",
        "self._weights = 1.0 / (positions + 1) if",
        ["tests/test_causal_methods.py::test_causal_informer_selected_rows_are_causal_softmax_and_lazy_rows_the_"
         "cumulative_mean"],
    ),
    (
        "mask-renormalise: the prefix sums of a low-rank matrix keep the diagonal (j <= i -> j < i)",
        "approxlab/methods/causal.py",
        "out.append(rows @ state + (rows @ columns).tril() @ values)",
        "out.append(rows @ state + (rows @ columns).tril(-1) @ values)",
        ["tests/test_causal_methods.py::test_mask_renormalise_is_the_bidirectional_matrix_masked_and_renormalised"],
    ),
    (
        "HyperAttention Sec. 1.1: alpha is n times the largest squared column norm of D^-1 A (columns -> rows)",
        "approxlab/assumptions/hyperattention.py",
        "column_norms = torch.linalg.vector_norm(probabilities.to(torch.float64), dim=-2)",
        "column_norms = torch.linalg.vector_norm(probabilities.to(torch.float64), dim=-1)",
        ["tests/test_assumptions.py::test_alpha_is_n_times_the_largest_squared_column_norm"],
    ),
    (
        "HyperAttention Lemma 1: kappa removes each row's heaviest entries (largest -> smallest)",
        "approxlab/assumptions/hyperattention.py",
        "kept = logits.topk(heavy, dim=-1).indices",
        "kept = logits.topk(heavy, dim=-1, largest=False).indices",
        ["tests/test_assumptions.py::test_kappa_is_the_light_row_sum_ratio"],
    ),
    (
        "Alman-Song Thm. 1.3-1.4: B of the model's Q, K for exp(QK^T/d) is p^(1/4) max|entry| (1/4 -> 1/2)",
        "approxlab/assumptions/bounded_entries.py",
        "return q.shape[-1] ** 0.25 * largest.to(torch.float64)",
        "return q.shape[-1] ** 0.5 * largest.to(torch.float64)",
        ["tests/test_assumptions.py::test_entry_bounds"],
    ),
    (
        "Attention sinks (Xiao et al.): the sink mass leaves out row 0 (rows 1.. -> all rows)",
        "approxlab/assumptions/__init__.py",
        "return probabilities[..., 1:, 0].to(torch.float64).mean(-1)",
        "return probabilities[..., :, 0].to(torch.float64).mean(-1)",
        ["tests/test_assumptions.py::test_sink_mass"],
    ),
    (
        "HyperAttention Algorithm 3 / Lemma 2: S samples columns with p_j = ||v_j||^2 / ||V||_F^2 (squares dropped)",
        "approxlab/methods/hyperattention.py",
        "weights = value_weights(v, self.key_mask, 2.0)",
        "weights = value_weights(v, self.key_mask, 1.0)",
        ["tests/test_hyperattention.py::test_algorithm_3_sampled_product_is_unbiased_with_its_variance"],
    ),
    (
        "HyperAttention Algorithm 2: residual samples exclude the query's own block (no double counting)",
        "approxlab/methods/hyperattention.py",
        'residual = logits_at(q, k, sampled).masked_fill_(in_block, float("-inf"))',
        'residual = logits_at(q, k, sampled).masked_fill_(in_block & False, float("-inf"))',
        ["tests/test_hyperattention.py::test_algorithm_2_row_sums_are_unbiased_without_clipping_and_clipping_only_"
         "lowers_them"],
    ),
    (
        "Alman-Song polynomial method: multinomial weights sqrt(g! / prod alpha!) of the tensor features (sqrt dropped)",
        "approxlab/methods/polynomial.py",
        "weights = [math.sqrt(math.factorial(degree)",
        "weights = [(math.factorial(degree)",
        ["tests/test_polynomial.py::test_chebyshev_interpolation_error_bound_holds_for_every_entry"],
    ),
    (
        "RPCholesky (Chen, Epperly, Tropp, Webber) trace bound: pivots drawn by the residual diagonal (-> uniform)",
        "approxlab/sketch.py",
        "pivot = inverse_cdf(residual, uniforms[..., i : i + 1])",
        "pivot = inverse_cdf(torch.ones_like(residual), uniforms[..., i : i + 1])",
        ["tests/test_rpcholesky.py::test_theorem_trace_error_bound"],
    ),
    (
        "Stable rank ||P||_F^2 / ||P||_2^2 of the causal D^-1 A (squares dropped)",
        "approxlab/assumptions/__init__.py",
        'row["stable_rank"] = frobenius**2 / row["spectral_norm"] ** 2',
        'row["stable_rank"] = frobenius / row["spectral_norm"]',
        ["tests/test_assumptions.py::test_measure_assumptions_against_brute_force"],
    ),
    (
        "Top-k oracle bound ||o_i - o~_i|| <= 2 delta_i max_j ||v_j|| (keeps the k smallest logits instead)",
        "approxlab/methods/_selection.py",
        "top, top_indices = row_topk(logits, budget)",
        "top, top_indices = logits.topk(budget, dim=-1, largest=False)",
        ["tests/test_sparse_attention.py::test_topk_theorem_dropped_mass_bounds_each_rows_error"],
    ),
    (
        "vAttention: the tail sample size scales as epsilon^-2 (the factor dropped)",
        "approxlab/methods/vattention.py",
        "trace_covariance / (epsilon * denominator * output_norm) ** 2",
        "trace_covariance / (denominator * output_norm) ** 2",
        ["tests/test_vattention.py::test_theorem_fraction_of_queries_beyond_epsilon_is_at_most_delta"],
    ),
    (
        "MagicPIG: a key is sampled with the probability of at least t collisions in L tables (t -> t - 1)",
        "approxlab/methods/magicpig.py",
        "for s in range(1, min_collisions):",
        "for s in range(1, min_collisions - 1):",
        ["tests/test_magicpig.py::test_a_key_is_sampled_with_its_probability_over_hyperplane_draws"],
    ),
    (
        "HyperAttention Algorithm 4: the causal recursion splits n positions at ceil(n/2) (-> floor(n/2))",
        "approxlab/methods/hyperattention.py",
        "return start + (stop - start + 1) // 2",
        "return start + (stop - start) // 2",
        ["tests/test_assumption_criteria.py::test_causal_blocks_tile_the_causal_pattern_as_the_method_splits_it"],
    ),
    (
        "HyperAttention Lemma 1 with sortLSH's mask: kappa keeps the entries outside the query's block (mask inverted)",
        "approxlab/assumptions/hyperattention.py",
        'light = logits.to(torch.float64).masked_fill(heavy_mask.to(logits.device), float("-inf"))',
        'light = logits.to(torch.float64).masked_fill(~heavy_mask.to(logits.device), float("-inf"))',
        ["tests/test_assumption_criteria.py::test_sortlsh_kappa_hand_computed"],
    ),
    (
        "Uniform sampling of a row-stochastic P: m = alpha / eps^2 samples bound E||error||_F^2 (eps^2 -> eps)",
        "approxlab/assumptions/hyperattention.py",
        'return check_positive_float(alpha, "alpha", allow_zero=True) / epsilon**2',
        'return check_positive_float(alpha, "alpha", allow_zero=True) / epsilon',
        ["tests/test_assumption_criteria.py::test_uniform_sampling_needs_alpha_over_eps_squared_samples"],
    ),
    (
        "Alman-Song Thm. 1.3-1.4: the balanced split (cQ, K/c) has B = p^(1/4) sqrt(|Q|_max |K|_max) (sqrt dropped)",
        "approxlab/assumptions/bounded_entries.py",
        "return q.shape[-1] ** 0.25 * torch.sqrt(_largest(q) * _largest(k))",
        "return q.shape[-1] ** 0.25 * (_largest(q) * _largest(k))",
        ["tests/test_assumption_criteria.py::test_split_bounds_are_ordered_and_labelled"],
    ),
    (
        "Alman-Song labels: 'fails for every split' only strictly above the threshold (> -> >=)",
        "approxlab/assumptions/bounded_entries.py",
        "labels = np.where(lower > threshold, FAILS_FOR_EVERY_SPLIT, UNDETERMINED).astype(object)",
        "labels = np.where(lower >= threshold, FAILS_FOR_EVERY_SPLIT, UNDETERMINED).astype(object)",
        ["tests/test_assumption_criteria.py::test_split_bounds_are_ordered_and_labelled"],
    ),
    (
        "Performer Lemma 2: positive features' relative variance is (e^||x+y||^2 - 1) / r (expm1 -> exp)",
        "approxlab/assumptions/performer.py",
        "return float(torch.expm1(torch.tensor(xy_norm, dtype=torch.float64))) / num_features",
        "return float(torch.exp(torch.tensor(xy_norm, dtype=torch.float64))) / num_features",
        ["tests/test_assumption_criteria.py::test_lemma2_relative_variance_of_positive_features"],
    ),
    (
        "Percentile bootstrap of a median: covers at most 1 - 2 * 0.5^W, about 93% at W = 8 (95% -> 99.5% quantiles)",
        "approxlab/stats/intervals.py",
        "clean, alpha = np.where(bad[..., None], 0.0, values), (1 - level) / 2",
        "clean, alpha = np.where(bad[..., None], 0.0, values), (1 - level) / 20",
        ["tests/test_stats_coverage.py::test_percentile_bootstrap_of_a_median_covers_the_range_of_its_units_at_most"],
    ),
]

ROOT = Path(__file__).resolve().parent.parent
COPIED = ("approxlab", "tests", "pyproject.toml")
TIMEOUT_S = 600


def _copy_tree(dest: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore)
        else:
            shutil.copy2(src, dest / name)


def _pytest(copy: Path, tests: list[str], *options: str) -> tuple[int, str]:
    """Run pytest on ``tests`` inside ``copy`` (imports the copy); return (status, output tail)."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTHONPATH", None)
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *options, *tests]
    try:
        done = subprocess.run(command, cwd=copy, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {TIMEOUT_S} s"
    lines = (done.stdout + done.stderr).strip().splitlines()
    return done.returncode, lines[-1] if lines else ""


def _check_imports_copy(copy: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import approxlab; print(approxlab.__file__)"],
        cwd=copy, capture_output=True, text=True, env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"),
    )
    imported = Path(done.stdout.strip()).resolve()
    if copy.resolve() not in imported.parents:
        sys.exit(f"mutation_check: the copy in {copy} does not import its own approxlab (got {imported})")


def _baseline(copy: Path, mutations, run_tests: bool) -> bool:
    """Every named test is collected (and, with ``run_tests``, passes) on the unmutated copy."""
    every_test = sorted({test for *_, tests in mutations for test in tests})
    status, tail = _pytest(copy, every_test, *(() if run_tests else ("--collect-only",)))
    what = "pass" if run_tests else "are collected"
    print(f"baseline: {len(every_test)} named tests {what} unmutated: {'yes' if status == 0 else 'NO'} ({tail})", flush=True)
    return status == 0


def _mutate_and_run(copy: Path, mutation) -> str:
    """Apply one mutation in ``copy``, run its tests there, restore the file; return its verdict line."""
    statement, path, old, new, tests = mutation
    target = copy / path
    original = target.read_text() if target.exists() else ""
    count = original.count(old)
    if count != 1:
        return f"STALE   {statement}: old text found {count} times in {path} (must be exactly once)"
    target.write_text(original.replace(old, new))
    start = time.monotonic()
    try:
        status, tail = _pytest(copy, tests)
    finally:
        target.write_text(original)
    verdict = "caught" if status == 1 else "MISSED" if status == 0 else f"ERROR {status}"
    return f"{verdict:7s} {statement} [{path}] ({time.monotonic() - start:.0f} s: {tail})"


def _run(mutations, run_baseline: bool, jobs: int) -> int:
    jobs = max(1, min(jobs, len(mutations)))
    with tempfile.TemporaryDirectory(prefix="approxlab-mutation-") as tmp:
        copies = [Path(tmp) / f"copy{index}" for index in range(jobs)]
        for copy in copies:
            _copy_tree(copy)
        _check_imports_copy(copies[0])
        if not _baseline(copies[0], mutations, run_baseline):
            print(f"0 caught, {len(mutations)} missed")
            return 1
        free = queue.SimpleQueue()  # each copy runs one mutation at a time
        for copy in copies:
            free.put(copy)

        def one(mutation) -> str:
            copy = free.get()
            try:
                return _mutate_and_run(copy, mutation)
            finally:
                free.put(copy)

        caught = missed = 0
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            for line in pool.map(one, mutations):
                caught += line.startswith("caught")
                missed += not line.startswith("caught")
                print(line, flush=True)
    print(f"{caught} caught, {missed} missed")
    return 1 if missed else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print the mutation table and exit")
    parser.add_argument("--baseline", action="store_true", help="also run the named tests unmutated first")
    parser.add_argument("--match", metavar="TEXT", default="",
                        help="only the mutations whose statement contains TEXT (case-insensitive)")
    parser.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)), metavar="N",
                        help="mutations run side by side, each in its own copy (default: the usable cores)")
    args = parser.parse_args(argv)
    mutations = [row for row in MUTATIONS if args.match.lower() in row[0].lower()]
    if not mutations:
        parser.error(f"--match {args.match!r} names no mutation")
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1; got {args.jobs}")
    if args.list:
        for statement, path, old, new, tests in mutations:
            print(f"{statement}\n    {path}: {old!r} -> {new!r}\n    tests: {' '.join(tests)}")
        return 0
    return _run(mutations, args.baseline, args.jobs)


if __name__ == "__main__":
    sys.exit(main())
