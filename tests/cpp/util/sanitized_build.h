// Whether this is an ASan or TSan build, for tests that widen their timeouts or shorten their
// soaks there: instrumented code runs several times slower and ctest runs two tests at once.
#pragma once

namespace hvdc {
namespace test {

// GCC's and Clang's spellings.
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitizedBuild = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
constexpr bool kSanitizedBuild = true;
#else
constexpr bool kSanitizedBuild = false;
#endif
#else
constexpr bool kSanitizedBuild = false;
#endif

}  // namespace test
}  // namespace hvdc
