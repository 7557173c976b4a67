/* Where a TCP ping-pong's time goes: the anchors' raw busy-poll loop
 * (127.0.0.1, TCP_NODELAY, recv(MSG_DONTWAIT) until the 8 bytes are in,
 * parent on core 0, child on core 1) with made-up work added
 *   IDLE   rounds of dependent multiply-adds after every empty recv, or
 *   PATH   rounds between receiving the message and sending the answer
 *          (the receive-to-send path a transport's own code lengthens).
 * One round is about 4 cycles. Prints the half round trip.
 *
 *   cc -O2 -o /tmp/rawpp scripts/rawpp.c
 *   /tmp/rawpp IDLE ITERS [PATH]      e.g. /tmp/rawpp 0 20000 300
 *
 * README "Fast boxes", ninth anchors run: work on every empty poll changed
 * nothing up to about 1 µs of it; 100 and 300 rounds on the path added
 * 0.10 and 0.35 µs. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile unsigned long sink;
static int idle_work, path_work;

static void work(int rounds) {
  unsigned long x = sink;
  for (int i = 0; i < rounds; i++) x = x * 6364136223846793005UL + 1442695040888963407UL;
  sink = x;
}

static void pin(int cpu) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu, &s);
  if (sched_setaffinity(0, sizeof s, &s) != 0) perror("sched_setaffinity");
}

static void rcv(int s, char *b) {
  size_t got = 0;
  while (got < 8) {
    ssize_t k = recv(s, b + got, 8 - got, MSG_DONTWAIT);
    if (k > 0)
      got += (size_t)k;
    else if (k == 0)
      exit(1);
    else
      work(idle_work);
  }
}

static void snd(int s, const char *b) {
  size_t put = 0;
  while (put < 8) {
    ssize_t k = send(s, b + put, 8 - put, 0);
    if (k > 0) put += (size_t)k;
  }
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s IDLE ITERS [PATH]\n", argv[0]);
    return 2;
  }
  idle_work = atoi(argv[1]);
  int iters = atoi(argv[2]);
  path_work = argc > 3 ? atoi(argv[3]) : 0;
  int one = 1, l = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t al = sizeof a;
  if (l < 0 || bind(l, (void *)&a, sizeof a) || listen(l, 1) || getsockname(l, (void *)&a, &al)) {
    perror("listen");
    return 1;
  }
  char b[8] = {0};
  pid_t p = fork();
  if (p == 0) {
    pin(1);
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0 || connect(s, (void *)&a, sizeof a)) _exit(1);
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    for (int i = 0; i < iters + 1000; i++) {
      rcv(s, b);
      work(path_work);
      snd(s, b);
    }
    _exit(0);
  }
  pin(0);
  int s = accept(l, 0, 0);
  if (s < 0) {
    perror("accept");
    return 1;
  }
  setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  struct timespec t0, t1;
  for (int i = 0; i < 1000; i++) {
    snd(s, b);
    rcv(s, b);
    work(path_work);
  }
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int i = 0; i < iters; i++) {
    snd(s, b);
    rcv(s, b);
    work(path_work);
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double ns = (double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec);
  printf("idle=%d path=%d half round trip %.3f us\n", idle_work, path_work, ns / 1e3 / iters / 2);
  wait(NULL);
  return 0;
}
