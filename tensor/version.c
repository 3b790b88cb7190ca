/*
 * version.c — qkv_version: the library's version, which meson.build passes in as QKV_PROJECT_VERSION from
 * project(version : ...); meson.build also checks that include/qkv.h's QKV_VERSION says the same.
 */
#include "qkv_internal.h"

#ifndef QKV_PROJECT_VERSION
#error "QKV_PROJECT_VERSION is set by meson.build from the project version"
#endif

const char *qkv_version(void) { return QKV_PROJECT_VERSION; }
