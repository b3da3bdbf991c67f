// Bus-error guard: runs a copy so that a SIGBUS raised by its own memory accesses unwinds
// back to the caller, which reports a failed copy, instead of killing kvd.
//
// Why. kvd maps memory that other processes control: a client's shared-memory segment that
// the client truncates after registering (a page beyond the file's new end raises SIGBUS on
// access), or a tmpfs page that cannot be allocated. Checking sizes before a copy leaves a
// window the client can hit at will; the fault itself is the only reliable signal.
//
// How. A SIGBUS handler is installed once per process (chained to whatever handler was there
// before: a SIGBUS outside a guarded copy behaves exactly as without the guard). While a
// thread runs inside RunCatchingBusErrors, a SIGBUS on that thread jumps back (siglongjmp)
// to the guard, which returns false. The signal disposition is process state by nature; the
// jump target is per thread, so guarded copies on different threads are independent.
//
// Contract for `fn`: it only reads and writes memory (memcpy loops); between the guard and
// any faulting access it owns no object with a destructor, holds no lock and allocates
// nothing, because an unwinding jump skips destructors. The bytes it wrote before the fault
// stay written; the caller must treat the whole copy as failed.
#pragma once

namespace kvd::transfer {

// Runs fn(arg) on this thread; false when a SIGBUS cut it short.
bool RunCatchingBusErrors(void (*fn)(void*), void* arg);

template <typename F>
bool RunCatchingBusErrors(F& f) {
  return RunCatchingBusErrors([](void* p) { (*static_cast<F*>(p))(); }, &f);
}

}  // namespace kvd::transfer
