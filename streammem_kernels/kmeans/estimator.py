"""``KMeans``: scikit-learn's estimator interface over ``batched_kmeans``, for one problem or a batch.

``KMeans(n_clusters, init="k-means++", n_init="auto", max_iter=300, tol=1e-4, random_state=None)`` with
``fit``, ``predict``, ``fit_predict`` and the fitted ``cluster_centers_``, ``labels_``, ``inertia_``,
``n_iter_``, as scikit-learn's ``sklearn.cluster.KMeans`` (Lloyd's algorithm, its greedy k-means++, its
tolerance rule, the best of ``n_init`` runs by inertia).  ``X`` may also be a batch ``(B, N, D)`` of
independent problems: each gets its own best run.  ``docs/ops/kmeans.md`` compares the two.
"""
from __future__ import annotations

import warnings

import numpy as np
import torch

from ..runtime.validate import (as_tensor, check_dtype, check_finite, check_float,
                                check_int, check_rank)
from . import (_INITS, _METRICS, _POINT_DTYPES, MAX_ITERS, _largest_magnitude, _power_of_two_scale, _scaled_float32,
               _working_dtype, batched_kmeans)
from .reference import assign_torch

__all__ = ["KMeans", "NotFittedError"]

_X_SHAPES = "(n_samples, n_features) or (B, n_samples, n_features)"
_FITTED = ("cluster_centers_", "labels_", "inertia_", "n_iter_")
_RANDOM_STATE_TYPES = "random_state must be None, an int, or a numpy RandomState or Generator"


class NotFittedError(ValueError, AttributeError):
    """``predict`` or a fitted attribute used before ``fit`` (scikit-learn's exception has the same bases,
    so ``except ValueError`` and ``hasattr`` behave alike)."""


class KMeans:
    """k-means clustering (Lloyd) with scikit-learn's interface, on one problem or a batch of them.

    Parameters
    ----------
    n_clusters : int, default 8
        Clusters per problem, ``1 <= n_clusters <= n_samples``.
    init : {"k-means++", "random", "first"} or array, default "k-means++"
        scikit-learn's greedy k-means++ (``2 + floor(ln k)`` candidates per
        step, the one lowering the potential most kept), ``n_clusters``
        distinct points drawn uniformly, the first ``n_clusters`` points, or
        the initial centres: ``(n_clusters, n_features)``, or
        ``(B, n_clusters, n_features)`` for a batch.
    n_init : "auto" or int, default "auto"
        Runs from different seeds; each problem keeps its run of lowest
        inertia (the first on ties).  "auto": 10 for ``init="random"``, else 1
        (scikit-learn's).  Given centres run once (a warning when ``n_init``
        asks for more, as scikit-learn).
    max_iter : int, default 300
        Maximum Lloyd iterations per run, ``1 <= max_iter <= 10,000``.
    tol : float, default 1e-4
        A run stops once the total squared centre shift of an iteration is
        ``<= tol`` x the mean per-feature variance of its problem's points
        (scikit-learn's rule), or when an iteration changes no label.
    random_state : None, int, numpy RandomState or Generator, default None
        Draws the ``n_init`` seeds (scikit-learn's convention: an int makes
        ``fit`` reproducible, None draws from numpy's global generator).
    metric : {"l2", "cosine"}, default "l2"
        Squared Euclidean (scikit-learn's), or spherical k-means (unit-norm
        points and centres).
    backend : {"auto", "torch", "cpp", "triton", "cuda"}, default "auto"
        ``batched_kmeans``' backend.

    Attributes
    ----------
    cluster_centers_ : (n_clusters, n_features) or (B, n_clusters, n_features)
        float64 for float64 ``X``, float32 otherwise (computed in float32).
    labels_ : (n_samples,) or (B, n_samples) int64
    inertia_ : float, or (B,) float64 for a batch
        Sum of squared distances of the points to their centres (weighted by
        ``sample_weight``).
    n_iter_ : int, or (B,) int64 for a batch
        Lloyd iterations of the run kept.
    n_features_in_ : int

    The arrays are numpy arrays when ``X`` was one (a list, a numpy array),
    tensors on ``X``'s device when it was a tensor.

    Notes
    -----
    Every dtype is clustered in float32 (float64 ``X`` is rounded once), so
    points within float32 rounding of two centres may be assigned otherwise
    than scikit-learn's float64 computation assigns them.  ``predict`` assigns
    by the reference's float32 rule, the rule every backend's ``labels_``
    follows: on the training data it returns ``labels_`` except for such
    ties.
    """

    def __init__(self, n_clusters: int = 8, *, init="k-means++", n_init="auto", max_iter: int = 300,
                 tol: float = 1e-4, random_state=None, metric: str = "l2", backend: str = "auto"):
        self.n_clusters = n_clusters
        self.init = init
        self.n_init = n_init
        self.max_iter = max_iter
        self.tol = tol
        self.random_state = random_state
        self.metric = metric
        self.backend = backend

    # ------------------------------------------------------------------
    # scikit-learn's parameter protocol (clone, grid search)
    # ------------------------------------------------------------------
    _PARAMS = ("n_clusters", "init", "n_init", "max_iter", "tol", "random_state", "metric", "backend")

    def get_params(self, deep: bool = True) -> dict:
        """The constructor's arguments, by name."""
        return {name: getattr(self, name) for name in self._PARAMS}

    def set_params(self, **params) -> KMeans:
        """Set constructor arguments by name (unknown names raise ``ValueError``); returns ``self``."""
        for name, value in params.items():
            if name not in self._PARAMS:
                raise ValueError(f"KMeans has no parameter {name!r}; known: {self._PARAMS}")
            setattr(self, name, value)
        return self

    def __repr__(self) -> str:
        defaults = KMeans().get_params()
        changed = [f"{k}={v!r}" for k, v in self.get_params().items()
                   if not (type(v) is type(defaults[k]) and _same(v, defaults[k]))]
        return f"KMeans({', '.join(changed)})"

    # ------------------------------------------------------------------
    # fit / predict
    # ------------------------------------------------------------------
    def fit(self, X, y=None, sample_weight=None) -> KMeans:
        """Cluster ``X``; returns ``self``.

        Parameters
        ----------
        X : (n_samples, n_features) or (B, n_samples, n_features) array or tensor
            float32, float64, float16 or bfloat16, finite; not modified.
        y : ignored
            (scikit-learn's signature.)
        sample_weight : (n_samples,) or (B, n_samples) array or tensor, optional
            Non-negative weights with a positive sum per problem.

        Raises
        ------
        ValueError
            Naming the argument (``X``, ``sample_weight``, ``n_clusters``,
            ``n_init``, ``max_iter``, ``tol``, ``init``, ``random_state``,
            ``metric``).
        """
        x, numpy_out = _as_points(X)
        n_samples = x.shape[-2]
        n_clusters = check_int(self.n_clusters, "n_clusters", minimum=1)
        if n_clusters > n_samples:
            raise ValueError(f"n_clusters must be <= n_samples = {n_samples}, got {n_clusters}")
        max_iter = check_int(self.max_iter, "max_iter", minimum=1)
        if max_iter > MAX_ITERS:
            raise ValueError(f"max_iter must be <= {MAX_ITERS}, got {max_iter}")
        tol = check_float(self.tol, "tol", low=0.0)
        if self.metric not in _METRICS:
            raise ValueError(f"metric must be one of {_METRICS}, got {self.metric!r}")
        init, n_init = self._resolve_init()
        weights = None if sample_weight is None else _as_weights(sample_weight, x)
        best = None
        for seed in _seeds(self.random_state, n_init):
            run = batched_kmeans(x, n_clusters, iters=max_iter, tol=tol, init=init, metric=self.metric,
                                 weights=weights, random_state=seed, backend=self.backend)
            if best is None:
                best = run
                continue
            better = run.inertia < best.inertia  # per problem; the earlier run on ties (scikit-learn's)
            best = type(run)(*(torch.where(better.reshape(better.shape + (1,) * (new.dim() - better.dim())), new, old)
                               for new, old in zip(run, best)))
        self.n_features_in_ = int(x.shape[-1])
        self._single = x.dim() == 2
        self._numpy = numpy_out
        self._centres = best.centroids  # kept as a tensor for predict
        self.cluster_centers_ = _out(best.centroids, numpy_out)
        self.labels_ = _out(best.labels, numpy_out)
        if self._single:
            self.inertia_, self.n_iter_ = float(best.inertia), int(best.n_iter)
        else:
            self.inertia_, self.n_iter_ = _out(best.inertia, numpy_out), _out(best.n_iter, numpy_out)
        return self

    def fit_predict(self, X, y=None, sample_weight=None):
        """``fit(X, sample_weight=sample_weight).labels_``."""
        return self.fit(X, sample_weight=sample_weight).labels_

    def predict(self, X):
        """Index of the nearest fitted centre of every point of ``X``.

        Parameters
        ----------
        X : (n, n_features) array or tensor, or (B, n, n_features) for a batch fit (the same B)
            Any dtype ``fit`` takes, finite.

        Returns
        -------
        (n,) or (B, n) int64, numpy or tensor as ``X``.

        Raises
        ------
        NotFittedError
            Before ``fit``.
        ValueError
            ``X`` of another rank, feature count or batch size than the fit.
        """
        if not hasattr(self, "_centres"):
            raise NotFittedError("this KMeans instance is not fitted yet; call fit(X) first")
        x, numpy_out = _as_points(X)
        if (x.dim() == 2) != self._single:
            expected = "(n, n_features)" if self._single else "(B, n, n_features)"
            raise ValueError(f"X must have shape {expected} like the data fitted, got {tuple(x.shape)}")
        centres = self._centres.to(x.device)
        if x.shape[-1] != self.n_features_in_ or (x.dim() == 3 and x.shape[0] != centres.shape[0]):
            raise ValueError(f"X must have {self.n_features_in_} features"
                             + ("" if self._single else f" and B = {centres.shape[0]} problems")
                             + f" like the data fitted, got shape {tuple(x.shape)}")
        if x.dim() == 2:
            x, centres = x[None], centres[None]
        labels = _nearest_centre(x, centres, self.metric == "cosine")
        return _out(labels[0] if self._single else labels, numpy_out)

    def _resolve_init(self):
        """(init for batched_kmeans, runs): "auto" resolved, given centres checked to run once."""
        init = self.init
        given = not isinstance(init, str)
        if not given and init not in _INITS:
            raise ValueError(f"init must be one of {_INITS} or an array of initial centres, got {init!r}")
        auto = isinstance(self.n_init, str) and self.n_init == "auto"
        if isinstance(self.n_init, str) and not auto:
            raise ValueError(f"n_init must be 'auto' or an int >= 1, got {self.n_init!r}")
        if auto:
            n_init = 10 if not given and init == "random" else 1
        else:
            n_init = check_int(self.n_init, "n_init", minimum=1)
        if given or init == "first":
            if n_init != 1:
                warnings.warn(f"init {'given as centres' if given else repr(init)} is deterministic: running one "
                              f"init instead of n_init={n_init}", RuntimeWarning, stacklevel=3)
            n_init = 1
            if given:
                init = as_tensor(init, "init")
        return init, n_init

    def __getattr__(self, name):
        # Only reached for attributes not set: the fitted ones before fit say so.
        if name in _FITTED or name == "n_features_in_":
            raise NotFittedError(f"this KMeans instance is not fitted yet (no {name}); call fit(X) first")
        raise AttributeError(f"'KMeans' object has no attribute {name!r}")


def _same(a, b) -> bool:
    try:
        return bool(a == b)
    except (TypeError, ValueError, RuntimeError):  # arrays of centres
        return False


def _as_points(X) -> tuple[torch.Tensor, bool]:
    """``X`` as a tensor (a numpy array as a zero-copy view), validated and named; and whether the results go
    back as numpy."""
    numpy_out = not isinstance(X, torch.Tensor)
    x = as_tensor(X, "X")
    check_rank(x, "X", (2, 3), _X_SHAPES)
    check_dtype(x, "X", _POINT_DTYPES)
    if x.shape[-1] == 0 or x.shape[-2] == 0 or (x.dim() == 3 and x.shape[0] == 0):
        raise ValueError(f"X must hold at least one sample of one feature, got shape {tuple(x.shape)}")
    check_finite(x, "X")
    return x, numpy_out


def _as_weights(sample_weight, x: torch.Tensor) -> torch.Tensor:
    w = as_tensor(sample_weight, "sample_weight")
    if tuple(w.shape) != tuple(x.shape[:-1]):
        raise ValueError(f"sample_weight must have shape {tuple(x.shape[:-1])}, got {tuple(w.shape)}")
    if w.is_complex() or w.dtype == torch.bool:
        raise ValueError(f"sample_weight must be real numbers, got dtype {str(w.dtype).replace('torch.', '')}")
    if w.is_floating_point():
        check_finite(w, "sample_weight")
    if bool((w < 0).any()):
        raise ValueError("sample_weight must be non-negative, found a negative weight")
    return w


def _seeds(random_state, n_init: int) -> list[int]:
    """The ``n_init`` runs' seeds, drawn as scikit-learn draws them (``randint(2**31 - 1, size=n_init)``)."""
    if random_state is None:
        return [int(s) for s in np.random.randint(np.iinfo(np.int32).max, size=n_init)]
    if isinstance(random_state, (bool, np.bool_)):
        raise ValueError(f"{_RANDOM_STATE_TYPES}, got {random_state!r}")
    if isinstance(random_state, (int, np.integer)):
        if not 0 <= random_state < 2**32:
            raise ValueError(f"random_state must lie in [0, 2**32) (a numpy seed), got {random_state}")
        random_state = np.random.RandomState(int(random_state))
    if isinstance(random_state, np.random.RandomState):
        return [int(s) for s in random_state.randint(np.iinfo(np.int32).max, size=n_init)]
    if isinstance(random_state, np.random.Generator):
        return [int(s) for s in random_state.integers(np.iinfo(np.int32).max, size=n_init)]
    raise ValueError(f"{_RANDOM_STATE_TYPES}, got {random_state!r}")


def _nearest_centre(x: torch.Tensor, centres: torch.Tensor, cosine: bool) -> torch.Tensor:
    """(B, n) labels of points x (B, n, D) against centres (B, k, D), by the reference's float32 assignment on
    both scaled by one power of two per problem (labels are invariant to it wherever the unscaled problem is
    computable; it keeps huge or tiny float64 data in float32's range)."""
    work = torch.float64 if torch.float64 in (x.dtype, centres.dtype) else torch.float32
    both = torch.cat([x.to(work), centres.to(work)], dim=1)
    scale = _power_of_two_scale(_largest_magnitude(both), _working_dtype(both))
    scaled = _scaled_float32(both, scale)
    points, centres32 = scaled[:, :x.shape[1]], scaled[:, x.shape[1]:]
    if cosine:
        points = torch.nn.functional.normalize(points, dim=-1)
        centres32 = torch.nn.functional.normalize(centres32, dim=-1)
    valid = torch.ones(points.shape[:2], dtype=torch.bool, device=points.device)
    return assign_torch(points.contiguous(), centres32.contiguous(), valid, cosine)


def _out(t: torch.Tensor, numpy_out: bool):
    return t.detach().cpu().numpy() if numpy_out else t

