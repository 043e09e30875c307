/* The pod sandbox ("pause") image's process: holds the pod's namespaces until it is told to stop.
 * As PID 1 of its PID namespace it gets no default signal actions, so SIGTERM and SIGINT need
 * handlers, or stopping a sandbox would wait for SIGKILL. Built static (`gcc -static`), it runs
 * in a FROM scratch image; the cluster cannot pull the upstream pause image. */
#include <signal.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }

int main(void) {
  signal(SIGTERM, stop);
  signal(SIGINT, stop);
  for (;;) pause();
}
