/* SPDX-License-Identifier: MIT */
#include "gguf/ggml.h"

#include <errno.h>
#include <stdio.h>

#include "common/macro.h"

/* Geometry from ggml's block structs (ggml-common.h): e.g. block_iq4_nl = fp16 d + 16 bytes. */
static const struct ggml_type_info types[GGML_TYPE_COUNT] = {
        [GGML_TYPE_F32] = { "F32", 1, 4, true },
        [GGML_TYPE_F16] = { "F16", 1, 2, true },
        [GGML_TYPE_Q4_0] = { "Q4_0", 32, 18, true },
        [GGML_TYPE_Q4_1] = { "Q4_1", 32, 20, true },
        [GGML_TYPE_Q5_0] = { "Q5_0", 32, 22, true },
        [GGML_TYPE_Q5_1] = { "Q5_1", 32, 24, true },
        [GGML_TYPE_Q8_0] = { "Q8_0", 32, 34, true },
        [GGML_TYPE_Q8_1] = { "Q8_1", 32, 36, false },
        [GGML_TYPE_Q2_K] = { "Q2_K", 256, 84, false },
        [GGML_TYPE_Q3_K] = { "Q3_K", 256, 110, false },
        [GGML_TYPE_Q4_K] = { "Q4_K", 256, 144, true },
        [GGML_TYPE_Q5_K] = { "Q5_K", 256, 176, true },
        [GGML_TYPE_Q6_K] = { "Q6_K", 256, 210, true },
        [GGML_TYPE_Q8_K] = { "Q8_K", 256, 292, false },
        [GGML_TYPE_IQ2_XXS] = { "IQ2_XXS", 256, 66, false },
        [GGML_TYPE_IQ2_XS] = { "IQ2_XS", 256, 74, false },
        [GGML_TYPE_IQ3_XXS] = { "IQ3_XXS", 256, 98, false },
        [GGML_TYPE_IQ1_S] = { "IQ1_S", 256, 50, false },
        [GGML_TYPE_IQ4_NL] = { "IQ4_NL", 32, 18, true },
        [GGML_TYPE_IQ3_S] = { "IQ3_S", 256, 110, false },
        [GGML_TYPE_IQ2_S] = { "IQ2_S", 256, 82, false },
        [GGML_TYPE_IQ4_XS] = { "IQ4_XS", 256, 136, true },
        [GGML_TYPE_I8] = { "I8", 1, 1, false },
        [GGML_TYPE_I16] = { "I16", 1, 2, false },
        [GGML_TYPE_I32] = { "I32", 1, 4, false },
        [GGML_TYPE_I64] = { "I64", 1, 8, false },
        [GGML_TYPE_F64] = { "F64", 1, 8, false },
        [GGML_TYPE_IQ1_M] = { "IQ1_M", 256, 56, false },
        [GGML_TYPE_BF16] = { "BF16", 1, 2, true },
        [GGML_TYPE_TQ1_0] = { "TQ1_0", 256, 54, false },
        [GGML_TYPE_TQ2_0] = { "TQ2_0", 256, 66, false },
        [GGML_TYPE_MXFP4] = { "MXFP4", 32, 17, false },
};

const struct ggml_type_info *ggml_type_get(uint32_t type) {
        if (type >= GGML_TYPE_COUNT || !types[type].name)
                return NULL;
        return &types[type];
}

const char *ggml_type_name(uint32_t type) {
        static _Thread_local char buf[32];
        const struct ggml_type_info *t = ggml_type_get(type);

        if (t)
                return t->name;
        snprintf(buf, sizeof buf, "type#%u", type);
        return buf;
}

int ggml_row_bytes(uint32_t type, uint64_t ne0, uint64_t *ret) {
        const struct ggml_type_info *t = ggml_type_get(type);

        if (!t || ne0 % t->block_size != 0)
                return -EINVAL;
        if (!mul_u64_ok(ne0 / t->block_size, t->type_size, ret))
                return -EOVERFLOW;
        return 0;
}
