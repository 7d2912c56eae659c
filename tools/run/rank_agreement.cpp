#include "run/rank_agreement.h"

#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>

#include "thdcp/comm/communicator.h"
#include "thdcp/comm/mpi.h"

namespace thdcp::tools {

namespace {

enum class Stand : int32_t { kReady = 0, kFailed = 1, kFinished = 2 };

// One rank's word in the agreement, the same bytes on every rank.
struct Word {
  Stand stand = Stand::kReady;
  int32_t code = 0;    // kFailed: its exit code
  uint64_t hash = 0;   // kFailed: of its message, to tell one shared refusal from several
};
static_assert(sizeof(Word) == 16, "Word is gathered as raw bytes");

enum class State { kOff, kDue, kAgreed };

State g_state = State::kOff;
bool g_collectives_started = false;
std::unique_ptr<Communicator> g_world;
std::vector<Word> g_words;  // every rank's, sized when enabled

// FNV-1a, over the parts of a message as printed.
uint64_t message_hash(const char* kind, const char* text, const char* more) {
  uint64_t h = 1469598103934665603ull;
  for (const char* part : {kind, "\n", text, more}) {
    for (const char* c = part; *c != '\0'; ++c) {
      h ^= static_cast<unsigned char>(*c);
      h *= 1099511628211ull;
    }
  }
  return h;
}

// Every rank's word, this rank's at rank().
void gather(const Word& mine) {
  g_state = State::kAgreed;
  g_world->all_gather(&mine, g_words.data(), sizeof(Word));
}

// The lowest rank whose word has `stand`, or -1.
int lowest(Stand stand) {
  for (size_t r = 0; r < g_words.size(); ++r) {
    if (g_words[r].stand == stand) return static_cast<int>(r);
  }
  return -1;
}

}  // namespace

void enable_rank_agreement() {
  g_world = mpi::world();
  g_words.assign(static_cast<size_t>(g_world->size()), Word{});
  g_state = State::kDue;
}

bool rank_agreement_due() { return g_state == State::kDue; }

bool collectives_started() { return g_collectives_started; }

void agree_before_collectives() {
  if (g_state != State::kDue) return;
  gather(Word{});
  const int failed = lowest(Stand::kFailed);
  if (failed >= 0) {
    // The failing ranks printed why; this one only stops, with their code.
    int32_t code = 0;
    for (const Word& w : g_words) {
      if (w.stand == Stand::kFailed && w.code > code) code = w.code;
    }
    throw RanksStopped(code);
  }
  const int finished = lowest(Stand::kFinished);
  if (finished >= 0) {
    if (lowest(Stand::kReady) == g_world->rank()) {
      std::fprintf(stderr,
                   "thdcp: error (rank %d): rank %d ran a command that takes no part in this run's collectives: "
                   "give every rank the same command line\n",
                   g_world->rank(), finished);
    }
    throw RanksStopped(2);
  }
  g_collectives_started = true;
}

int refuse_before_collectives(int code, const char* kind, const char* text, const char* more) {
  Word mine;
  mine.stand = Stand::kFailed;
  mine.code = code;
  mine.hash = message_hash(kind, text, more);
  gather(mine);
  const int rank = g_world->rank();
  if (lowest(Stand::kFailed) != rank) return code;  // a lower rank says why
  int refused = 0, ready = 0;
  bool same = true;
  for (const Word& w : g_words) {
    ready += w.stand == Stand::kReady ? 1 : 0;
    if (w.stand != Stand::kFailed) continue;
    ++refused;
    same = same && w.hash == mine.hash;
  }
  const int ranks = g_world->size();
  if (refused == ranks && same) {
    // One command line that every rank refused alike: said once, as without mpirun.
    std::fprintf(stderr, "thdcp: %s: %s%s\n", kind, text, more);
    return code;
  }
  std::fprintf(stderr, "thdcp: %s (rank %d): %s%s\n", kind, rank, text, more);
  // (Ranks that ran a command without collectives, plan say, ran it: "no rank ran" only when
  // some were ready to run this one.)
  std::fprintf(stderr, "thdcp: %d of %d ranks failed before the run (rank %d's message above%s)%s\n", refused, ranks,
               rank, refused == 1 ? "" : same ? ", the others' are the same" : ", the others' differ",
               ready > 0 ? "; no rank ran it" : "");
  return code;
}

void agree_without_collectives() {
  if (g_state != State::kDue) return;
  Word mine;
  mine.stand = Stand::kFinished;
  gather(mine);
}

}  // namespace thdcp::tools
