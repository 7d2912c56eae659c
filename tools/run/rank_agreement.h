// Under mpirun/srun each process is one rank, and one rank can refuse its command line or its
// inputs alone (an MPMD command line, a file one node lacks, rank 0's output checks). Left
// alone, that rank would exit while the others wait in their first collective forever. So
// every process takes part in one agreement, a small all-gather over MPI_COMM_WORLD, before
// any other collective:
//  - a rank that is about to run its first collective: agree_before_collectives();
//  - a rank that failed before it: main's catch block, refuse_before_collectives();
//  - a rank whose command has no collective (plan, run --graph, --help): main, when the
//    command returned, agree_without_collectives().
// Then every rank knows every rank's stand:
//  - all ready: the run goes on (collectives_started()); a rank that fails from then on
//    prints its message and ends the job (mpi::Session::abort).
//  - some failed: the lowest failing rank prints its message, without its rank when every
//    rank failed with the same message (one bad command line for all), else tagged with it
//    and followed by a line that counts the ranks that refused. The other ranks print
//    nothing. Failing ranks exit with their own code, ready ranks with the failing ranks'
//    highest (2 for bad input); none of them has run anything.
//  - ready ranks beside ranks that ran a command without collectives (no rank failed): the
//    lowest ready rank says so; the ready ranks exit 2.
// Without MPI (no agreement enabled) every function here returns at once.
#pragma once

namespace thdcp::tools {

// main, once an mpi::Session is live and before the command runs: this process is one rank
// and takes part in the agreement. Takes what the agreement needs (a communicator over
// MPI_COMM_WORLD, room for every rank's stand) now, so a rank that failed for want of memory
// can still take part.
void enable_rank_agreement();

// True while this process still has to take part (enabled, not yet agreed).
bool rank_agreement_due();

// What a ready rank hears when another rank did not get ready: the code to exit with. The
// message was printed by the rank that failed; main returns code() and prints nothing.
class RanksStopped {
 public:
  explicit RanksStopped(int code) : code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};

// A rank about to enter its first collective: returns once every rank is ready too, throws
// RanksStopped otherwise. Returns at once without an agreement (no MPI) or when already agreed.
void agree_before_collectives();

// True once agree_before_collectives() returned: from then on an error may leave the other
// ranks inside a collective, and the failing rank must end the job.
bool collectives_started();

// main's catch block, while rank_agreement_due(): this rank failed with exit code `code`;
// `kind` ("error", "internal error") and `text` + `more` make its message. Takes part in the
// agreement, prints the message if this rank is the one to, and returns `code`. Allocates
// nothing (the failure may be std::bad_alloc).
int refuse_before_collectives(int code, const char* kind, const char* text, const char* more);

// main, after a command returned without taking part in any collective.
void agree_without_collectives();

}  // namespace thdcp::tools
