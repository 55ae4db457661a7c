// Note [OpenMP wait policy]
// The CPU kernels (oneDNN) run on GNU OpenMP teams, one per lane worker. With several lanes
// busy, or any other load on the host, the teams oversubscribe the cores, and OpenMP's
// default of spinning at barriers (about 3 ms before sleeping) turned a 3 ms iteration into a
// 90 ms one (measured on a loaded 2-core host). Sleeping at once instead costs a futex wake-up
// per parallel region, and an iteration of many small steps pays it at every one: a Keras MLP's
// captured step (~150 steps) took 4.6 ms sleeping and 2.7 ms spinning. So the threads spin
// briefly, then sleep: OMP_WAIT_POLICY=PASSIVE with GOMP_SPINCOUNT=kOpenMpSpinCount (tens of
// microseconds). libgomp spins that long only while its threads do not outnumber the CPUs it
// may use; with several teams busy it sleeps at once, as before. Against another process's
// load it cannot see, the short spin measured as passive waiting does (two 2-thread processes on
// 2 cores: 3.3-3.6 ms a step either way, 8.0 ms with a 300,000-poll spin). libgomp reads both when
// it loads, before main(), so a program that runs kernels re-executes itself once with them unless
// the environment already chose a policy (then it is left exactly as given). The daemon does this,
// and so must anything that times kernels to compare with it.
#pragma once

namespace salus {

// Spins before a waiting OpenMP thread sleeps (libgomp's unit: about 10 ns each).
inline constexpr const char* kOpenMpSpinCount = "1000";

// Call first thing in main(). Returns only when the policy is set (possibly after a
// re-execution); if re-executing fails, the program continues, only slower under load.
void EnsurePassiveOpenMpWait(char** argv);

}  // namespace salus
