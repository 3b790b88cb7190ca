/*
 * sinks_arms.c — the arms of examples/sinks (sinks.h), one table entry each: a name and the change it makes to
 * a qkv_model_config. examples/stability's --arms runs the same table.
 */
#include <stdio.h>
#include <string.h>

#include "sinks.h"

static void arm_softmax(qkv_model_config *c) { c->attn_variant = QKV_ATTN_SOFTMAX; }
static void arm_softmax1(qkv_model_config *c) { c->attn_variant = QKV_ATTN_SOFTMAX1; }
static void arm_sink(qkv_model_config *c) { c->attn_variant = QKV_ATTN_SINK; }
static void arm_sigmoid(qkv_model_config *c) { c->attn_variant = QKV_ATTN_SIGMOID; }
static void arm_ssmax(qkv_model_config *c) { c->attn_variant = QKV_ATTN_SSMAX; }
static void arm_softpick(qkv_model_config *c) { c->attn_variant = QKV_ATTN_SOFTPICK; }
// the softmax with a sigmoid gate on each element of z (Qiu et al. 2025's best, G1 elementwise): a head can
// shut its output off without parking weight anywhere
static void arm_gate(qkv_model_config *c) { c->attn_variant = QKV_ATTN_SOFTMAX, c->attn_gate = QKV_GATE_ELEMENT; }
// differential attention (Ye et al. 2024): two softmaxes subtracted, which cancels weight both put on one key
static void arm_diff(qkv_model_config *c) { c->attn_variant = QKV_ATTN_SOFTMAX, c->attn_diff = true; }

const sinks_arm sinks_arms[] = {
    {"softmax", arm_softmax}, {"softmax1", arm_softmax1}, {"sink", arm_sink},
    {"sigmoid", arm_sigmoid}, {"ssmax", arm_ssmax},       {"softpick", arm_softpick},
    {"gate", arm_gate},       {"diff", arm_diff},
};
const int sinks_arm_count = (int)(sizeof sinks_arms / sizeof *sinks_arms);

const sinks_arm *sinks_arm_find(const char *name) {
    for (int a = 0; name && a < sinks_arm_count; a++)
        if (!strcmp(sinks_arms[a].name, name)) return &sinks_arms[a];
    return NULL;
}

bool sinks_arms_parse(const char *list, const sinks_arm **arms, int max, int *n, char *err, size_t size) {
    *n = 0;
    const char *p = list ? list : "";
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char name[64];
        if (len == 0 || len >= sizeof name) {
            snprintf(err, size, "--arms '%s': an empty or overlong name", list ? list : "");
            return false;
        }
        memcpy(name, p, len), name[len] = '\0';
        const sinks_arm *a = sinks_arm_find(name);
        if (!a) {
            int at = snprintf(err, size, "--arms: unknown arm '%s' (one of", name);
            for (int k = 0; k < sinks_arm_count && at > 0 && (size_t)at < size; k++)
                at += snprintf(err + at, size - (size_t)at, "%s%s", k ? "," : " ", sinks_arms[k].name);
            if (at > 0 && (size_t)at < size) snprintf(err + at, size - (size_t)at, ")");
            return false;
        }
        for (int k = 0; k < *n; k++)
            if (arms[k] == a) return snprintf(err, size, "--arms: '%s' twice", name), false;
        if (*n >= max) return snprintf(err, size, "--arms: more than %d arms", max), false;
        arms[(*n)++] = a;
        if (!comma) return true;
        p = comma + 1;
    }
}
