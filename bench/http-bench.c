/* bench/http-bench: requests per second of one GET URL over keep-alive connections
 * (libcurl, one easy handle per thread, reused), for SECONDS. The same client measures
 * ephemerald and its bare libmicrohttpd peer, so the ratio is the server's.
 *
 * Usage: bench/http-bench URL SECONDS THREADS [HEADER]
 * Prints "REQS_PER_S ERRORS". */
#include <config.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <curl/curl.h>

static const char *url, *header;
static double seconds;

typedef struct worker {
  pthread_t t;
  long ok, errors;
} worker_t;

static double
now_s(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static size_t
discard(char *p, size_t size, size_t n, void *opaque)
{
  (void)p, (void)opaque;
  return size * n;
}

static void *
work(void *arg)
{
  worker_t *w = arg;
  CURL *c = curl_easy_init();
  struct curl_slist *h = header ? curl_slist_append(NULL, header) : NULL;
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, discard);
  if (h)
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
  double end = now_s() + seconds;
  while (now_s() < end) {
    long code = 0;
    if (curl_easy_perform(c) == CURLE_OK &&
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code) == CURLE_OK && code == 200)
      w->ok++;
    else
      w->errors++;
  }
  curl_slist_free_all(h);
  curl_easy_cleanup(c);
  return NULL;
}

int
main(int argc, char **argv)
{
  if (argc < 4) {
    fprintf(stderr, "usage: http-bench URL SECONDS THREADS [HEADER]\n");
    return 2;
  }
  url = argv[1];
  seconds = atof(argv[2]);
  int n = atoi(argv[3]);
  header = argc > 4 ? argv[4] : NULL;
  curl_global_init(CURL_GLOBAL_DEFAULT);
  worker_t *w = calloc((size_t)n, sizeof *w);
  double t0 = now_s();
  for (int i = 0; i < n; i++)
    pthread_create(&w[i].t, NULL, work, &w[i]);
  long ok = 0, errors = 0;
  for (int i = 0; i < n; i++) {
    pthread_join(w[i].t, NULL);
    ok += w[i].ok;
    errors += w[i].errors;
  }
  double dt = now_s() - t0;
  printf("%.0f %ld\n", (double)ok / dt, errors);
  free(w);
  curl_global_cleanup();
  return 0;
}
