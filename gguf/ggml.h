/* SPDX-License-Identifier: MIT */
/* ggml tensor type ids and their block geometry (docs/model.md §6). The GGUF reader needs the geometry of
 * every type a file may name, supported or not, to check tensor sizes; the engine computes with
 * the few marked `computable`. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

enum ggml_type {
        GGML_TYPE_F32 = 0,
        GGML_TYPE_F16 = 1,
        GGML_TYPE_Q4_0 = 2,
        GGML_TYPE_Q4_1 = 3,
        GGML_TYPE_Q5_0 = 6,
        GGML_TYPE_Q5_1 = 7,
        GGML_TYPE_Q8_0 = 8,
        GGML_TYPE_Q8_1 = 9,
        GGML_TYPE_Q2_K = 10,
        GGML_TYPE_Q3_K = 11,
        GGML_TYPE_Q4_K = 12,
        GGML_TYPE_Q5_K = 13,
        GGML_TYPE_Q6_K = 14,
        GGML_TYPE_Q8_K = 15,
        GGML_TYPE_IQ2_XXS = 16,
        GGML_TYPE_IQ2_XS = 17,
        GGML_TYPE_IQ3_XXS = 18,
        GGML_TYPE_IQ1_S = 19,
        GGML_TYPE_IQ4_NL = 20,
        GGML_TYPE_IQ3_S = 21,
        GGML_TYPE_IQ2_S = 22,
        GGML_TYPE_IQ4_XS = 23,
        GGML_TYPE_I8 = 24,
        GGML_TYPE_I16 = 25,
        GGML_TYPE_I32 = 26,
        GGML_TYPE_I64 = 27,
        GGML_TYPE_F64 = 28,
        GGML_TYPE_IQ1_M = 29,
        GGML_TYPE_BF16 = 30,
        GGML_TYPE_TQ1_0 = 34,
        GGML_TYPE_TQ2_0 = 35,
        GGML_TYPE_MXFP4 = 39,
        GGML_TYPE_COUNT = 40,
};

struct ggml_type_info {
        const char *name;    /* "IQ4_NL" */
        uint32_t block_size; /* values per block */
        uint32_t type_size;  /* bytes per block */
        bool computable;     /* the CPU backend can dequantize / dot it */
};

/* NULL for ids that are not (or no longer) ggml types. */
const struct ggml_type_info *ggml_type_get(uint32_t type);
/* "IQ4_NL", or "type#77" style text in a static per-thread buffer for unknown ids. */
const char *ggml_type_name(uint32_t type);
/* Bytes of one row of ne0 values; -EINVAL if the type is unknown or ne0 is not a whole number of
 * blocks, -EOVERFLOW on overflow. */
int ggml_row_bytes(uint32_t type, uint64_t ne0, uint64_t *ret);
