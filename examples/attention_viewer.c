/*
 * attention_viewer.c — one self-contained HTML page of a model's attention on a prompt: the tokens, every layer's
 * and head's pattern as a heat map (hover a cell to read its weight; click a panel to enlarge it), and the logit
 * lens beside them (each layer's top prediction at each position, hover for the top five).
 *
 *   build/examples/attention_viewer --load model.safetensors --prompt "Once upon" --out page.html
 *   build/examples/attention_viewer --load model.safetensors --ids 3,1,4,1,5 --out page.html
 *
 * The page needs no network: the data is a JSON object in a <script type="application/json"> element and the
 * drawing script is inline. The patterns are blocks.L.attn.hook_pattern of one causal forward (include/qkv/hooks.h),
 * the lens qkv_model_logit_lens's rows through a softmax. --prompt takes the text's bytes as ids (a byte-level
 * vocabulary, as examples/train uses for text); --ids takes comma-separated ids. Written atomically.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "atomic_file.h"
#include "qkv.h"

#define PROG "attention_viewer"
#define TOP 5 /* predictions listed per lens cell */

static void usage(FILE *out) {
    fprintf(out, "usage: " PROG " --load MODEL.safetensors (--prompt TEXT | --ids I,J,...) --out PAGE.html\n"
                 "One self-contained HTML page: the prompt's tokens, each layer's and head's attention pattern as a heat\n"
                 "map (hover to read a weight), and the logit lens (each layer's top predictions) beside it.\n"
                 "--prompt takes the text's bytes as ids; --ids comma-separated ids in [0, vocab). At most n_ctx tokens.\n");
}

/* A JSON string of a token's label: printable ASCII as itself (JSON-escaped, and '<' '>' '&' as \u escapes so the
 * text cannot close the script element), anything else as its id in angle brackets. */
static void json_label(FILE *f, int32_t id, bool bytes) {
    fputc('"', f);
    if (bytes && id >= 32 && id < 127) {
        if (id == '"' || id == '\\') fprintf(f, "\\%c", (char)id);
        else if (id == '<' || id == '>' || id == '&') fprintf(f, "\\u%04x", (unsigned)id);
        else fputc(id, f);
    } else if (bytes && id == '\n') {
        fputs("\\u21b5", f); // a return arrow
    } else {
        fprintf(f, "\\u2039%" PRId32 "\\u203a", id); // <id> in single angle quotes
    }
    fputc('"', f);
}

static const char *page_head =
    "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>qkv attention viewer</title>\n<style>\n"
    "body{font:14px system-ui,sans-serif;margin:16px;color:#222}\n"
    "#tokens span{display:inline-block;border:1px solid #ccc;margin:1px;padding:1px 4px;font-family:monospace}\n"
    "#tokens span.hi{background:#fd8}\n"
    "#main{display:flex;gap:24px;align-items:flex-start}\n"
    ".layer{margin:8px 0}.layer h3{margin:4px 0;font-size:14px}\n"
    ".panel{display:inline-block;margin:0 8px 8px 0;text-align:center;cursor:pointer}\n"
    ".panel canvas{border:1px solid #999;image-rendering:pixelated}\n"
    "#tip{position:fixed;pointer-events:none;background:#fff;border:1px solid #888;padding:3px 6px;display:none;"
    "font-family:monospace;white-space:pre}\n"
    "table.lens{border-collapse:collapse;font-family:monospace}\n"
    "table.lens td,table.lens th{border:1px solid #ccc;padding:2px 4px;text-align:center}\n"
    "#big canvas{border:1px solid #444}\n"
    "</style></head><body>\n<h2>Attention</h2>\n<div id=\"meta\"></div>\n<div id=\"tokens\"></div>\n"
    "<div id=\"main\"><div id=\"heads\"></div><div><h3 id=\"bigtitle\"></h3><div id=\"big\"></div>"
    "<h3>Logit lens</h3><div id=\"lens\"></div></div></div>\n<div id=\"tip\"></div>\n";

/* The drawing script: no library, no network. */
static const char *page_script =
    "<script>\n"
    "const D = JSON.parse(document.getElementById('data').textContent);\n"
    "const n = D.tokens.length, tip = document.getElementById('tip');\n"
    "document.getElementById('meta').textContent = D.model + ' \\u2014 ' + D.n_layer + ' layers, ' + D.n_head +\n"
    "  ' heads per layer, ' + n + ' tokens';\n"
    "const tokDiv = document.getElementById('tokens');\n"
    "D.tokens.forEach((t, i) => { const s = document.createElement('span'); s.textContent = t; s.title = 'position ' + i;\n"
    "  s.id = 'tok' + i; tokDiv.appendChild(s); });\n"
    "function mark(i, j) { document.querySelectorAll('#tokens span').forEach(s => s.classList.remove('hi'));\n"
    "  [i, j].forEach(k => { if (k >= 0) document.getElementById('tok' + k).classList.add('hi'); }); }\n"
    "function show(e, text) { tip.textContent = text; tip.style.display = 'block';\n"
    "  tip.style.left = (e.clientX + 12) + 'px'; tip.style.top = (e.clientY + 12) + 'px'; }\n"
    "function hide() { tip.style.display = 'none'; mark(-1, -1); }\n"
    "function heat(canvas, A, cell, l, h) {\n"
    "  canvas.width = canvas.height = n * cell; const g = canvas.getContext('2d');\n"
    "  for (let i = 0; i < n; i++) for (let j = 0; j < n; j++) {\n"
    "    const w = Math.max(0, Math.min(1, A[i][j])), c = Math.round(255 * (1 - w));\n"
    "    g.fillStyle = 'rgb(' + c + ',' + c + ',255)'; g.fillRect(j * cell, i * cell, cell, cell); }\n"
    "  canvas.onmousemove = e => { const r = canvas.getBoundingClientRect();\n"
    "    const j = Math.floor((e.clientX - r.left) / cell), i = Math.floor((e.clientY - r.top) / cell);\n"
    "    if (i < 0 || j < 0 || i >= n || j >= n) return hide();\n"
    "    mark(i, j); show(e, 'layer ' + l + ' head ' + h + '\\nquery ' + i + ' ' + D.tokens[i] + '\\nkey   ' + j + ' ' +\n"
    "      D.tokens[j] + '\\nweight ' + A[i][j].toFixed(4)); };\n"
    "  canvas.onmouseleave = hide; }\n"
    "const big = document.getElementById('big'), bigCanvas = document.createElement('canvas'); big.appendChild(bigCanvas);\n"
    "function enlarge(l, h) { document.getElementById('bigtitle').textContent = 'layer ' + l + ' head ' + h;\n"
    "  heat(bigCanvas, D.patterns[l][h], Math.max(8, Math.floor(360 / n)), l, h); }\n"
    "const heads = document.getElementById('heads');\n"
    "for (let l = 0; l < D.n_layer; l++) { const row = document.createElement('div'); row.className = 'layer';\n"
    "  row.innerHTML = '<h3>layer ' + l + '</h3>'; heads.appendChild(row);\n"
    "  for (let h = 0; h < D.n_head; h++) { const p = document.createElement('div'); p.className = 'panel';\n"
    "    const c = document.createElement('canvas'); c.className = 'head'; p.appendChild(c);\n"
    "    p.appendChild(document.createElement('br')); p.appendChild(document.createTextNode('head ' + h));\n"
    "    heat(c, D.patterns[l][h], Math.max(3, Math.floor(120 / n)), l, h); p.onclick = () => enlarge(l, h);\n"
    "    row.appendChild(p); } }\n"
    "enlarge(0, 0);\n"
    "const lens = document.createElement('table'); lens.className = 'lens';\n"
    "let head = '<tr><th></th>'; D.tokens.forEach((t, i) => { head += '<th>' + i + '</th>'; }); lens.innerHTML = head + '</tr>';\n"
    "D.lens.forEach((rows, l) => { const tr = document.createElement('tr'); const th = document.createElement('th');\n"
    "  th.textContent = l == 0 ? 'embed' : 'block ' + (l - 1); tr.appendChild(th);\n"
    "  rows.forEach((top, i) => { const td = document.createElement('td'); td.textContent = top[0][0];\n"
    "    td.style.background = 'rgba(255,140,0,' + top[0][1].toFixed(3) + ')';\n"
    "    td.onmousemove = e => { mark(i, -1); show(e, 'after ' + th.textContent + ', position ' + i + '\\n' +\n"
    "      top.map(p => p[0] + '  ' + p[1].toFixed(4)).join('\\n')); };\n"
    "    td.onmouseleave = hide; tr.appendChild(td); }); lens.appendChild(tr); });\n"
    "document.getElementById('lens').appendChild(lens);\n"
    "</script>\n</body></html>\n";

int main(int argc, char **argv) {
    const char *load = NULL, *prompt = NULL, *ids_text = NULL, *out = NULL;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (args_is_help(f)) return usage(stdout), 0;
        const char **dst = !strcmp(f, "--load") ? &load : !strcmp(f, "--prompt") ? &prompt : !strcmp(f, "--ids") ? &ids_text
                         : !strcmp(f, "--out") ? &out : NULL;
        if (!dst) return args_unknown(PROG, f);
        if (!(*dst = args_value(PROG, argc, argv, &i))) return 2;
    }
    if (!load || !out || !prompt == !ids_text)
        return fprintf(stderr, PROG ": needs --load, --out, and one of --prompt and --ids (--help)\n"), 2;
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_model *m = ctx ? qkv_model_load(ctx, load) : NULL;
    if (!m) {
        fprintf(stderr, PROG ": --load %s: %s\n", load, ctx ? qkv_errmsg(ctx) : "out of memory");
        qkv_ctx_free(ctx);
        return 1;
    }
    const qkv_model_config *c = qkv_model_get_config(m);
    int64_t n = 0, cap = c->n_ctx;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    bool bytes = prompt != NULL, ok = ids != NULL;
    if (prompt) {
        for (const unsigned char *p = (const unsigned char *)prompt; ok && *p; p++) {
            if (n == cap) ok = false, fprintf(stderr, PROG ": --prompt: more than n_ctx = %" PRId64 " bytes\n", cap);
            else if (*p >= c->vocab)
                ok = false, fprintf(stderr, PROG ": --prompt: byte %u is not below vocab = %" PRId64 "\n", *p, c->vocab);
            else ids[n++] = *p;
        }
    } else {
        for (const char *p = ids_text; ok && *p;) {
            char *end;
            errno = 0;
            long v = strtol(p, &end, 10);
            if (end == p || errno || v < 0 || v >= c->vocab || (*end && *end != ','))
                ok = false, fprintf(stderr, PROG ": --ids %s: \"%.20s\" is not an id in [0, %" PRId64 ")\n", ids_text, p,
                                    c->vocab);
            else if (n == cap) ok = false, fprintf(stderr, PROG ": --ids: more than n_ctx = %" PRId64 " ids\n", cap);
            else ids[n++] = (int32_t)v, p = *end ? end + 1 : end;
        }
    }
    if (ok && n == 0) ok = false, fprintf(stderr, PROG ": the prompt is empty\n");
    if (!ok) {
        free(ids);
        qkv_ctx_free(ctx);
        return 2;
    }
    qkv_set_grad_enabled(ctx, false);
    qkv_tensor *x = qkv_from_data(ctx, QKV_I32, 2, (int64_t[]){1, n}, ids);
    qkv_tensor *lens = qkv_model_logit_lens(ctx, m, x, QKV_CAUSAL);
    qkv_tensor *logits = qkv_model_run_with_cache(ctx, m, x, QKV_CAUSAL, "*hook_pattern");
    int64_t L = c->n_layer, H = c->n_head, V = c->vocab;
    atomic_file a;
    FILE *f = logits && lens ? atomic_open(&a, out) : NULL;
    if (f) {
        fputs(page_head, f);
        fputs("<script id=\"data\" type=\"application/json\">\n{\"model\": ", f);
        const char *base = strrchr(load, '/') ? strrchr(load, '/') + 1 : load;
        fputc('"', f);
        for (const char *p = base; *p; p++) // the file name, JSON-safe
            fputc(isalnum((unsigned char)*p) || strchr("._-", *p) ? *p : '_', f);
        fprintf(f, "\", \"n_layer\": %" PRId64 ", \"n_head\": %" PRId64 ",\n\"tokens\": [", L, H);
        for (int64_t i = 0; i < n; i++) fputs(i ? ", " : "", f), json_label(f, ids[i], bytes);
        fputs("],\n\"patterns\": [", f);
        for (int64_t l = 0; l < L; l++) {
            char name[64];
            snprintf(name, sizeof name, "blocks.%" PRId64 ".attn.hook_pattern", l);
            const qkv_tensor *A = qkv_model_cached(ctx, m, name); // [H, n, n]
            fputs(l ? ",\n [" : "\n [", f);
            for (int64_t h = 0; A && h < H; h++) {
                fputs(h ? ", [" : "[", f);
                for (int64_t i = 0; i < n; i++) {
                    fputs(i ? ", [" : "[", f);
                    for (int64_t j = 0; j < n; j++)
                        fprintf(f, j ? ",%.6g" : "%.6g", qkv_get_flat(ctx, A, (h * n + i) * n + j));
                    fputc(']', f);
                }
                fputc(']', f);
            }
            fputc(']', f);
        }
        fputs("],\n\"lens\": [", f);
        double *p = malloc((size_t)V * sizeof *p);
        for (int64_t l = 0; p && l <= L; l++) { // softmax of each lens row, its TOP largest
            fputs(l ? ",\n [" : "\n [", f);
            for (int64_t i = 0; i < n; i++) {
                double mx = -HUGE_VAL, sum = 0;
                for (int64_t v = 0; v < V; v++) p[v] = qkv_get_flat(ctx, lens, (l * n + i) * V + v), mx = fmax(mx, p[v]);
                for (int64_t v = 0; v < V; v++) sum += p[v] = exp(p[v] - mx);
                fputs(i ? ", [" : "[", f);
                for (int k = 0; k < TOP && k < V; k++) {
                    int64_t best = 0;
                    for (int64_t v = 1; v < V; v++) best = p[v] > p[best] ? v : best;
                    fputs(k ? ", [" : "[", f);
                    json_label(f, (int32_t)best, bytes);
                    fprintf(f, ", %.6g]", p[best] / sum);
                    p[best] = -1; // taken
                }
                fputc(']', f);
            }
            fputc(']', f);
        }
        if (!p) qkv_set_error(ctx, QKV_ERR_NOMEM, PROG ": out of memory for the lens");
        free(p);
        fputs("]}\n</script>\n", f);
        fputs(page_script, f);
    }
    int status = 0;
    if (!logits || !lens || qkv_error(ctx)) {
        fprintf(stderr, PROG ": %s\n", qkv_errmsg(ctx));
        if (f) atomic_abandon(&a);
        status = 1;
    } else if (!f || !atomic_commit(&a)) {
        fprintf(stderr, PROG ": --out %s: %s\n", out, strerror(errno));
        status = 1;
    } else {
        printf("wrote %s: %" PRId64 " tokens, %" PRId64 " layers of %" PRId64 " heads\n", out, n, L, H);
    }
    free(ids);
    qkv_ctx_free(ctx);
    return status;
}
