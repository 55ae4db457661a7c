// Note [OpenMP wait policy]
// The CPU kernels (oneDNN) run on GNU OpenMP teams, one per lane worker. With several lanes
// busy, or any other load on the host, the teams oversubscribe the cores, and OpenMP's
// default of spinning at barriers turned a 3 ms iteration into a 90 ms one (measured on a
// loaded 2-core host). Passive waiting costs a few microseconds per barrier instead. libgomp
// reads the policy when it loads, before main(), so a program that runs kernels re-executes
// itself once with OMP_WAIT_POLICY=PASSIVE unless the environment already chose a policy.
// The daemon does this, and so must anything that times kernels to compare with it.
#pragma once

namespace salus {

// Call first thing in main(). Returns only when the policy is set (possibly after a
// re-execution); if re-executing fails, the program continues, only slower under load.
void EnsurePassiveOpenMpWait(char** argv);

}  // namespace salus
