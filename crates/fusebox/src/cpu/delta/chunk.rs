//! One chunk of the chunked (WY) delta rule: what both passes compute inside a chunk.
//!
//! For a chunk of L tokens that starts from state S, with cumulative log-decays
//! `G_i = Σ_{m≤i} g_m`, `γ_i = e^{G_i}`, `η_i = e^{G_{L−1} − G_i}` and the decay matrix
//! `M_ij = e^{G_i − G_j}` (j ≤ i), unrolling the recurrence gives, for the rows
//! `δ_j = β_j(v_j − u_j)` of Δ (the writes to the state),
//!
//! ```text
//! δ_j = β_j v_j − β_j γ_j Sᵀk_j − Σ_{m<j} β_j M_jm (k_j·k_m) δ_m
//! ```
//!
//! that is `(I + A)·Δ = βV − (βγK)·S` with A strictly lower, `A_jm = β_j M_jm (k_j·k_m)`.
//! With `T = (I + A)⁻¹` (unit lower triangular; never formed, applied by substitution):
//!
//! ```text
//! U  = T·(βV)            Wn = −T·(βγK)           Δ = U + Wn·S
//! P  = M ⊙ (Q̃Kᵀ), j ≤ i  O  = (γQ̃)·S + P·Δ       S' = γ_{L−1}·S + (ηK)ᵀ·Δ
//! ```
//!
//! (Q̃ = scale·Q.) Products are `L×L×D` and `L×D×D`, on the GEMM.

use super::{lanes, nn, nt, tn, HeadAt, Inputs};

/// The quantities of one chunk, row-major, for chunks of at most `cap` tokens.
pub(super) struct Chunk {
    pub dk: usize,
    pub dv: usize,
    /// Tokens in the chunk now (L).
    pub len: usize,
    /// First token of the chunk.
    pub t0: usize,
    /// `[L, Dk]` keys.
    pub k: Vec<f32>,
    /// `[L, Dk]` queries times scale (Q̃).
    pub q: Vec<f32>,
    /// `[L, Dv]` values.
    pub v: Vec<f32>,
    /// `[L]` β.
    pub beta: Vec<f32>,
    /// `[L]` G, the cumulative log-decays.
    pub gcum: Vec<f32>,
    /// `[L]` γ = e^G.
    pub gamma: Vec<f32>,
    /// `[L]` η = e^{G_{L−1} − G}.
    pub eta: Vec<f32>,
    /// `[L, L]` M (zero above the diagonal).
    pub decay: Vec<f32>,
    /// `[L, L]` K·Kᵀ.
    pub kk: Vec<f32>,
    /// `[L, L]` A (zero on and above the diagonal).
    pub a: Vec<f32>,
    /// `[L, L]` Q̃·Kᵀ.
    pub qk: Vec<f32>,
    /// `[L, L]` P (zero above the diagonal).
    pub p: Vec<f32>,
    /// `[L, Dv]` U = T·(βV).
    pub u: Vec<f32>,
    /// `[L, Dk]` Wn = −T·(βγK).
    pub wn: Vec<f32>,
    /// `[L, Dv]` Δ = U + Wn·S.
    pub delta: Vec<f32>,
    /// `[L, Dk]` scratch: γQ̃ or ηK.
    pub scaled: Vec<f32>,
}

impl Chunk {
    pub fn new(dk: usize, dv: usize, cap: usize) -> Chunk {
        let z = |n: usize| vec![0.0f32; n];
        Chunk {
            dk,
            dv,
            len: 0,
            t0: 0,
            k: z(cap * dk),
            q: z(cap * dk),
            v: z(cap * dv),
            beta: z(cap),
            gcum: z(cap),
            gamma: z(cap),
            eta: z(cap),
            decay: z(cap * cap),
            kk: z(cap * cap),
            a: z(cap * cap),
            qk: z(cap * cap),
            p: z(cap * cap),
            u: z(cap * dv),
            wn: z(cap * dk),
            delta: z(cap * dv),
            scaled: z(cap * dk),
        }
    }

    /// Reads tokens `t0 .. t0 + len` of one head and computes everything that does not
    /// depend on the state: G, γ, η, M, K·Kᵀ, A, U and Wn. `with_outputs` also computes
    /// Q̃ and P (not needed by a scan that only carries the state).
    pub fn load(&mut self, x: &Inputs<'_>, at: HeadAt, t0: usize, len: usize, scale: f32, with_outputs: bool) {
        let (dk, dv, l) = (self.dk, self.dv, len);
        self.len = len;
        self.t0 = t0;
        let mut g = 0.0f32;
        for i in 0..l {
            let t = t0 + i;
            self.k[i * dk..(i + 1) * dk].copy_from_slice(&x.k[at.qk(t)..at.qk(t) + dk]);
            self.v[i * dv..(i + 1) * dv].copy_from_slice(&x.v[at.v(t)..at.v(t) + dv]);
            if with_outputs {
                for (d, &s) in self.q[i * dk..(i + 1) * dk].iter_mut().zip(&x.q[at.qk(t)..at.qk(t) + dk]) {
                    *d = scale * s;
                }
            }
            g += x.g[at.gate(t)];
            self.gcum[i] = g;
            self.beta[i] = x.beta[at.gate(t)];
        }
        let last = self.gcum[l - 1];
        for i in 0..l {
            self.gamma[i] = self.gcum[i].exp();
            self.eta[i] = (last - self.gcum[i]).exp();
        }
        let decay = &mut self.decay[..l * l];
        lanes::decay_matrix(&self.gcum[..l], decay);
        nt(&mut self.kk, &self.k, &self.k, l, l, dk, false);
        for j in 0..l {
            for m in 0..l {
                self.a[j * l + m] = if m < j { self.beta[j] * decay[j * l + m] * self.kk[j * l + m] } else { 0.0 };
            }
        }
        for i in 0..l {
            let b = self.beta[i];
            for (d, &s) in self.u[i * dv..(i + 1) * dv].iter_mut().zip(&self.v[i * dv..(i + 1) * dv]) {
                *d = b * s;
            }
            let c = -b * self.gamma[i];
            for (d, &s) in self.wn[i * dk..(i + 1) * dk].iter_mut().zip(&self.k[i * dk..(i + 1) * dk]) {
                *d = c * s;
            }
        }
        lanes::solve_unit_lower(&self.a[..l * l], l, &mut self.u[..l * dv], dv);
        lanes::solve_unit_lower(&self.a[..l * l], l, &mut self.wn[..l * dk], dk);
        if with_outputs {
            nt(&mut self.qk, &self.q, &self.k, l, l, dk, false);
            for ((p, &m), &qk) in self.p[..l * l].iter_mut().zip(decay.iter()).zip(&self.qk) {
                *p = m * qk;
            }
        }
    }

    /// Δ = U + Wn·S for the chunk's start state `s` (`[Dk, Dv]`).
    pub fn delta(&mut self, s: &[f32]) {
        let (l, dv) = (self.len, self.dv);
        self.delta[..l * dv].copy_from_slice(&self.u[..l * dv]);
        nn(&mut self.delta, &self.wn, s, l, dv, self.dk, true);
    }

    /// `O = (γQ̃)·S + P·Δ` into `o` (`[L, Dv]`), from the start state (after [`delta`](Self::delta)).
    pub fn output(&mut self, s: &[f32], o: &mut [f32]) {
        let (l, dk, dv) = (self.len, self.dk, self.dv);
        for i in 0..l {
            let c = self.gamma[i];
            for (d, &x) in self.scaled[i * dk..(i + 1) * dk].iter_mut().zip(&self.q[i * dk..(i + 1) * dk]) {
                *d = c * x;
            }
        }
        nn(o, &self.scaled, s, l, dv, dk, false);
        nn(o, &self.p, &self.delta, l, dv, l, true);
    }

    /// `S ← γ_{L−1}·S + (ηK)ᵀ·Δ` in place (after [`delta`](Self::delta)).
    pub fn advance(&mut self, s: &mut [f32]) {
        let (l, dk, dv) = (self.len, self.dk, self.dv);
        let keep = self.gamma[l - 1];
        s.iter_mut().for_each(|x| *x *= keep);
        for i in 0..l {
            let c = self.eta[i];
            for (d, &x) in self.scaled[i * dk..(i + 1) * dk].iter_mut().zip(&self.k[i * dk..(i + 1) * dk]) {
                *d = c * x;
            }
        }
        tn(s, &self.scaled, &self.delta, dk, dv, l, true);
    }
}
