/* SPDX-License-Identifier: MIT */
/* The one pseudo-random generator of the engine and the synthetic-model writer: splitmix64 to
 * seed, xoshiro256** (Blackman & Vigna, public-domain algorithms, own code) to draw. Inline: the
 * model writer draws billions. Streams depend on these exact formulas (seeded requests,
 * x4-mkmodel's files): never change them. */
#pragma once

#include <stdint.h>

static inline uint64_t splitmix64(uint64_t *x) {
        uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
}

static inline uint64_t rng_rotl(uint64_t x, int k) {
        return (x << k) | (x >> (64 - k));
}

static inline uint64_t xoshiro256_next(uint64_t s[4]) {
        uint64_t result = rng_rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = rng_rotl(s[3], 45);
        return result;
}

/* uniform in [0, 1) with 53 random bits */
static inline double xoshiro256_uniform(uint64_t s[4]) {
        return (double) (xoshiro256_next(s) >> 11) * 0x1p-53;
}
