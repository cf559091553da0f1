"""Feature maps of the linear-attention literature: ``hedgehog``, ``dpfp``, ``rebased``, ``t2r``.

Each map is written in plain torch after its paper and registered by name, so that
``KernelAttentionRegressor(feature_map="hedgehog")`` and the rank sweeps take it like
the library's own maps. Every map starts from the :class:`~minip_learn.nn.FeatureMap`
encoder ``z = encoder(x)`` (a learnable linear projection of the token bits, or a small
MLP with ``depth >= 1``) where the paper has its learnable projection of the head's
input, and ``rank`` is always the number of features the map returns:

============  ====================================  ==================  =========================
name          features                              rank                lower bound applies
============  ====================================  ==================  =========================
``t2r``       ``relu(z)``                           any ``r >= 1``      yes: features >= 0
``hedgehog``  ``softmax([2z, -2z])``                ``2 p`` (even)      yes: features > 0
``dpfp``      products of ``[relu(z), relu(-z)]``   ``2 p nu``          yes: features >= 0
              with its ``nu`` rolled copies
``rebased``   quadratic monomials of                ``p (p + 1) / 2``,  yes: signed features,
              ``h = gamma * ln(z) + beta``          ``p >= 2``          kernel ``(h . h')^2 / p``
============  ====================================  ==================  =========================

(``p`` is the encoder's output dimension, derived from ``rank``; a ``rank`` a map
cannot have is a ``ValueError`` naming the nearest valid ones.) The reference
implementations of these maps are those of ``fla.modules.feature_map`` in
flash-linear-attention; with the same weights the features here equal them (the tests
check it when the ``fla`` extra is installed: ``pip install minip-learn[fla]``).
"""

import math

import torch
from torch import nn

from .feature_maps import FeatureMap, register_feature_map

__all__ = ["DPFP", "T2R", "Hedgehog", "ReBased"]


def _rank_error(name, rank, form, below, above):
    """The ``ValueError`` of a ``rank`` that ``name`` cannot have."""
    nearest = ", ".join(f"{r} ({how})" for r, how in filter(None, (below, above)))
    return ValueError(
        f"feature_map={name!r} has rank {form}; rank={rank} is not of this form "
        f"(nearest valid ranks: {nearest})."
    )


def _check_multiple(name, rank, step, form):
    """``rank // step`` for a ``rank`` that is a positive multiple of ``step``; else
    the ``ValueError`` of ``name`` naming the nearest valid ranks."""
    if rank >= step and rank % step == 0:
        return rank // step
    low = rank // step * step
    below = (low, f"proj_dim={low // step}") if low >= step else None
    raise _rank_error(name, rank, form, below, (low + step, f"proj_dim={low // step + 1}"))


@register_feature_map("t2r")
class T2R(FeatureMap):
    """ReLU of a learnable linear map: ``phi(x) = relu(W x + b)`` (T2R).

    The feature map with which Kasai et al. (2021) convert a pretrained transformer
    into a recurrent network: one learnable projection per head followed by a ReLU.
    Any ``rank >= 1``; the features are ``>= 0``, so the kernel is nonnegative and the
    lower bound applies. Unlike ``relu`` (which adds a small floor), a token whose
    projections are all negative has zero features: as a key it receives no attention,
    as a query it attends to nothing (its output is the readout's bias).

    References
    ----------
    J. Kasai, H. Peng, Y. Zhang, D. Yogatama, G. Ilharco, N. Pappas, Y. Mao, W. Chen,
    N. A. Smith. "Finetuning Pretrained Transformers into RNNs". EMNLP 2021.
    https://arxiv.org/abs/2103.13076

    Examples
    --------
    >>> import torch
    >>> _ = torch.manual_seed(0)
    >>> from minip_learn.nn import make_feature_map
    >>> phi = make_feature_map("t2r", n_bits=6, rank=4)
    >>> out = phi(torch.rand(3, 6))
    >>> tuple(out.shape), bool((out >= 0).all()), phi.fused
    ((3, 4), True, 'linear')
    """

    paper = "Kasai et al. 2021, Finetuning Pretrained Transformers into RNNs"
    fused = "linear"

    def activation(self, z):
        return torch.relu(z)


@register_feature_map("hedgehog")
class Hedgehog(FeatureMap):
    """Hedgehog features: a softmax over ``[2 z, -2 z]`` with ``z = W x + b`` learnable.

    Zhang et al. (2024) learn a linear map whose exponentiated outputs, and those of its
    negation, mimic softmax attention; the softmax over the ``2 p`` entries normalises
    them (a positive factor per token). This is the form of the authors' reference
    implementation and of flash-linear-attention's ``HedgehogFeatureMap``, including
    its factor 2, so that weights copy across unchanged. ``rank = 2 p`` must be even;
    the encoder has ``p = rank / 2`` outputs.

    The features are positive, so the kernel is nonnegative and the lower bound
    applies. The map is exposed in log-domain (``log_features`` is the log-softmax), so
    the kernel head forms the kernel without underflow even for large projections.

    References
    ----------
    M. Zhang, K. Bhatia, H. Kumbong, C. Re. "The Hedgehog & the Porcupine: Expressive
    Linear Attentions with Softmax Mimicry". ICLR 2024. https://arxiv.org/abs/2402.04347

    Examples
    --------
    >>> import torch
    >>> _ = torch.manual_seed(0)
    >>> from minip_learn.nn import make_feature_map
    >>> phi = make_feature_map("hedgehog", n_bits=6, rank=8)
    >>> out = phi(torch.rand(3, 6))
    >>> tuple(out.shape), bool((out > 0).all()), torch.allclose(out.sum(-1), torch.ones(3))
    ((3, 8), True, True)
    """

    paper = ("Zhang et al. 2024, The Hedgehog & the Porcupine: Expressive Linear Attentions "
             "with Softmax Mimicry")
    log_domain = True
    rank_maskable = False

    def __init__(self, n_bits, rank, **kwargs):
        self.proj_dim = self.check_params(n_bits, rank)["proj_dim"]
        super().__init__(n_bits, rank, **kwargs)

    @classmethod
    def check_params(cls, n_bits, rank, **kwargs):
        """Validate ``rank`` (even, ``>= 2``); return ``{"proj_dim": rank // 2}``."""
        return {"proj_dim": _check_multiple("hedgehog", rank, 2, "2 * proj_dim")}

    @property
    def pre_dim(self):
        return self.proj_dim

    def log_features(self, x):
        z = 2.0 * self.encoder(x)
        return torch.log_softmax(torch.cat([z, -z], dim=-1), dim=-1)


@register_feature_map("dpfp")
class DPFP(FeatureMap):
    """Deterministic parameter-free projection (DPFP) of Schlag et al. (2021).

    With ``y = [relu(z), relu(-z)]`` (``2 p`` entries, ``z = encoder(x)``) the features
    are the products of ``y`` with its copies rolled by ``1 ... nu`` positions,

        ``phi(x) = [y * roll(y, 1), y * roll(y, 2), ..., y * roll(y, nu)]``,

    ``2 p nu`` features, nonnegative and mostly zero (each product needs two active
    half-rectified entries). The paper applies the projection to the head's keys and
    queries without parameters of its own; here it follows the learnable encoder, like
    every map of the library. ``rank`` must be a multiple of ``2 nu``; the encoder has
    ``p = rank / (2 nu)`` outputs. A token whose ``y`` has fewer than two active entries
    at the rolled distances has zero features (no attention received or given).

    Parameters
    ----------
    nu : int, default=1
        Number of rolled copies (the paper's DPFP-``nu``; it reports ``nu`` = 1, 2, 3).

    References
    ----------
    I. Schlag, K. Irie, J. Schmidhuber. "Linear Transformers Are Secretly Fast Weight
    Programmers". ICML 2021. https://arxiv.org/abs/2102.11174

    Examples
    --------
    >>> import torch
    >>> _ = torch.manual_seed(0)
    >>> from minip_learn.nn import make_feature_map
    >>> phi = make_feature_map("dpfp", n_bits=6, rank=12, nu=2)
    >>> out = phi(torch.rand(3, 6))
    >>> tuple(out.shape), phi.proj_dim, bool((out >= 0).all())
    ((3, 12), 3, True)
    """

    paper = "Schlag et al. 2021, Linear Transformers Are Secretly Fast Weight Programmers"

    def __init__(self, n_bits, rank, *, nu=1, **kwargs):
        params = self.check_params(n_bits, rank, nu=nu)
        self.nu, self.proj_dim = params["nu"], params["proj_dim"]
        super().__init__(n_bits, rank, **kwargs)

    @classmethod
    def check_params(cls, n_bits, rank, **kwargs):
        """Validate ``rank`` and ``nu``; return ``{"nu": nu, "proj_dim": p}``."""
        nu = kwargs.get("nu", 1)
        if isinstance(nu, bool) or not isinstance(nu, int) or nu < 1:
            raise ValueError(f"feature_map='dpfp' needs an integer nu >= 1; got nu={nu!r}.")
        proj_dim = _check_multiple("dpfp", rank, 2 * nu, f"2 * proj_dim * nu (nu={nu})")
        return {"nu": nu, "proj_dim": proj_dim}

    @property
    def pre_dim(self):
        return self.proj_dim

    def activation(self, z):
        y = torch.cat([torch.relu(z), torch.relu(-z)], dim=-1)
        return torch.cat([y * y.roll(j, dims=-1) for j in range(1, self.nu + 1)], dim=-1)

    def extra_repr(self):
        return f"{super().extra_repr()}, nu={self.nu}"


def _rebased_rank(proj_dim):
    """Number of quadratic features of ``proj_dim`` coordinates (``j <= k`` pairs)."""
    return proj_dim * (proj_dim + 1) // 2


@register_feature_map("rebased")
class ReBased(FeatureMap):
    """ReBased: quadratic features of a normalised projection (Aksenov et al., 2024).

    The projection ``z = encoder(x)`` (``p`` coordinates) is normalised over its
    coordinates and given a learnable scale and shift, ``h = gamma * ln(z) + beta`` with
    ``ln(z) = (z - mean(z)) / sqrt(var(z) + eps)`` (a LayerNorm); the features are the
    monomials of degree two,

        ``phi(x) = [h_k^2 / sqrt(p) for every k; sqrt(2 / p) h_j h_k for every j < k]``,

    so that ``phi(x) . phi(x') = (h . h')^2 / p``: the kernel of Based's Taylor map
    reduced to its quadratic term, made learnable by ``gamma`` and ``beta``. The order
    and scales are those of flash-linear-attention's ``RebasedFeatureMap``.

    ``rank = p (p + 1) / 2`` with ``p >= 2`` (3, 6, 10, 15, 21, 28 ...); ``p`` is derived
    from ``rank`` (a ``rank`` not of this form is a ``ValueError`` listing the nearest
    valid ones). The features are signed (``nonnegative = False``) but the kernel is a
    square, ``>= 0`` for every pair: the lower bound applies
    (``kernel_nonnegative = True``).

    Parameters
    ----------
    eps : float, default=1e-5
        Variance floor of the normalisation.

    References
    ----------
    Y. Aksenov, N. Balagansky, S. M. Lo Cicero Vaina, B. Shaposhnikov, A. Gorbatovski,
    D. Gavrilov. "Linear Transformers with Learnable Kernel Functions are Better
    In-Context Models". ACL 2024. https://arxiv.org/abs/2402.10644

    Examples
    --------
    >>> import torch
    >>> _ = torch.manual_seed(0)
    >>> from minip_learn.nn import make_feature_map
    >>> phi = make_feature_map("rebased", n_bits=6, rank=10)
    >>> x = torch.rand(5, 6)
    >>> out = phi(x)
    >>> tuple(out.shape), phi.proj_dim, bool((out @ out.T >= 0).all())
    ((5, 10), 4, True)
    """

    paper = ("Aksenov et al. 2024, Linear Transformers with Learnable Kernel Functions are "
             "Better In-Context Models")
    nonnegative = False
    #: the kernel ``(h . h')^2 / p`` is >= 0 although the features are signed
    kernel_nonnegative = True
    rank_maskable = False

    def __init__(self, n_bits, rank, *, eps=1e-5, **kwargs):
        self.proj_dim = self.check_params(n_bits, rank)["proj_dim"]
        super().__init__(n_bits, rank, **kwargs)
        self.eps = float(eps)
        self.gamma = nn.Parameter(torch.ones(self.proj_dim))
        self.beta = nn.Parameter(torch.zeros(self.proj_dim))
        off = torch.triu_indices(self.proj_dim, self.proj_dim, offset=1)
        self.register_buffer("_pairs", off, persistent=False)

    @classmethod
    def check_params(cls, n_bits, rank, **kwargs):
        """Validate ``rank`` (``p (p + 1) / 2``, ``p >= 2``); return ``{"proj_dim": p}``."""
        p = 2
        while _rebased_rank(p + 1) <= rank:
            p += 1
        if _rebased_rank(p) != rank:
            below = (_rebased_rank(p), f"proj_dim={p}") if rank > _rebased_rank(p) else None
            above_p = p + 1 if below else p
            raise _rank_error("rebased", rank, "proj_dim * (proj_dim + 1) / 2 with proj_dim >= 2",
                              below, (_rebased_rank(above_p), f"proj_dim={above_p}"))
        return {"proj_dim": p}

    @property
    def pre_dim(self):
        return self.proj_dim

    def activation(self, z):
        p = self.proj_dim
        h = nn.functional.layer_norm(z, (p,), self.gamma, self.beta, self.eps)
        j, k = self._pairs
        return torch.cat([h.square() / math.sqrt(p), h[..., j] * h[..., k] * math.sqrt(2.0 / p)],
                         dim=-1)

    def extra_repr(self):
        return f"{super().extra_repr()}, proj_dim={self.proj_dim}"
