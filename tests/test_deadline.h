/* test_deadline.h — a per-test time limit that holds when tests run in parallel.
 *
 * Criterion 2.4.1's own `.timeout` loses track of its requests when two timed tests overlap under --jobs 2
 * (BoxFort's cancel unlinks a request and then walks on through the list it moved it to), which
 * LeakSanitizer reports at exit as a 48-byte leak inside libcriterion and the suite fails. Each test that
 * needs a limit instead arms alarm() first thing: Criterion runs every test in its own worker process, so
 * past the limit SIGALRM ends that worker alone and Criterion reports the test as crashed (signal 14).
 * Processes the test forks do not inherit the alarm. Meson's per-suite timeout stays as the outer limit.
 */
#ifndef QKV_TEST_DEADLINE_H
#define QKV_TEST_DEADLINE_H

#include <unistd.h>

#define QKV_TEST_DEADLINE(seconds) ((void)alarm(seconds))

#endif
