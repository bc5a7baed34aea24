/*
 * The pod sandbox's process of the local Kubernetes node (local/pause:3.4.1, built by
 * scripts/k8s_images.sh with `gcc -static`, run FROM scratch). It holds the pod's
 * namespaces open and does nothing else: it sleeps until SIGINT or SIGTERM, then exits 0.
 * When the pod shares one PID namespace it is PID 1 there, so orphans are re-parented to
 * it: it reaps them on SIGCHLD, or they would linger as zombies.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define PAUSE_VERSION "capstan-pause 3.4.1"

static void exit_cleanly(int signo)
{
    (void)signo;
    _exit(0);
}

/* Collects every child that has ended; waitpid may clobber errno, which the
 * interrupted code may still read. */
static void reap_children(int signo)
{
    int saved = errno;
    (void)signo;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    errno = saved;
}

static int on_signal(int signo, void (*handler)(int), int flags)
{
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = handler;
    action.sa_flags = flags;
    sigemptyset(&action.sa_mask);
    return sigaction(signo, &action, NULL);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "-v") == 0) {
        puts(PAUSE_VERSION);
        return 0;
    }
    if (getpid() != 1) {
        fputs("pause: warning: not PID 1, orphans of this namespace go elsewhere\n", stderr);
    }
    if (on_signal(SIGINT, exit_cleanly, 0) || on_signal(SIGTERM, exit_cleanly, 0)
        || on_signal(SIGCHLD, reap_children, SA_NOCLDSTOP | SA_RESTART)) {
        perror("pause: sigaction");
        return 1;
    }
    for (;;) {
        pause();
    }
}
