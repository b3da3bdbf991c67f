#include "transfer/bus_error_guard.h"

#include <setjmp.h>
#include <signal.h>

#include <mutex>

namespace kvd::transfer {
namespace {

// The guard of the copy running on this thread, if any. Read by the signal handler:
// initial-exec TLS (a static executable's), which is async-signal-safe to access.
thread_local sigjmp_buf* t_guard = nullptr;

// The disposition found at installation, restored for faults outside a guarded copy.
// Written once (under std::call_once) before the handler can run.
struct sigaction g_previous {};
std::once_flag g_installed;

void OnBusError(int sig, siginfo_t* info, void* context) {
  if (sigjmp_buf* guard = t_guard) {
    t_guard = nullptr;
    siglongjmp(*guard, 1);
  }
  // Not ours: hand the fault to the previous handler, or let the default action (core dump)
  // happen when the faulting instruction runs again.
  if ((g_previous.sa_flags & SA_SIGINFO) != 0 && g_previous.sa_sigaction != nullptr) {
    g_previous.sa_sigaction(sig, info, context);
    return;
  }
  if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN &&
      g_previous.sa_handler != nullptr) {
    g_previous.sa_handler(sig);
    return;
  }
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(SIGBUS, &dfl, nullptr);
}

void Install() {
  struct sigaction sa {};
  sa.sa_sigaction = OnBusError;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGBUS, &sa, &g_previous);
}

}  // namespace

bool RunCatchingBusErrors(void (*fn)(void*), void* arg) {
  std::call_once(g_installed, Install);
  sigjmp_buf guard;
  sigjmp_buf* const outer = t_guard;  // a guarded copy inside another one (not expected)
  if (sigsetjmp(guard, /*savemask=*/1) != 0) {
    t_guard = outer;
    return false;
  }
  t_guard = &guard;
  fn(arg);
  t_guard = outer;
  return true;
}

}  // namespace kvd::transfer
