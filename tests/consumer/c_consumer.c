/* A C program against the installed C ABI (thdcp::c, libthdcp.so): the library's version
 * must be the version of the CMake package that found it, and the ABI version 1.
 * Prints PASS or FAIL; exits 1 on failure. Built only when the package has thdcp::c. */
#include <stdio.h>
#include <string.h>

#include <thdcp/thdcp.h>

#ifndef THDCP_EXPECTED_VERSION
#error "THDCP_EXPECTED_VERSION (the package's version) must be defined"
#endif

int main(void) {
  int failures = 0;
  const char* version = thdcp_version_string();
  int abi = thdcp_abi_version();
  printf("c_consumer: thdcp_version_string() = \"%s\", package version \"%s\"\n", version ? version : "(null)",
         THDCP_EXPECTED_VERSION);
  printf("c_consumer: thdcp_abi_version() = %d\n", abi);
  if (version == NULL || strcmp(version, THDCP_EXPECTED_VERSION) != 0) {
    printf("  the library's version is not the package's: FAILED\n");
    ++failures;
  }
  if (abi != 1) {
    printf("  ABI version %d, expected 1: FAILED\n", abi);
    ++failures;
  }
#ifdef THDCP_ABI_VERSION
  if (abi != THDCP_ABI_VERSION) {
    printf("  the library's ABI version %d is not the header's THDCP_ABI_VERSION %d: FAILED\n", abi,
           THDCP_ABI_VERSION);
    ++failures;
  }
#endif
  printf("c_consumer: %s\n", failures == 0 ? "PASS" : "FAIL");
  return failures == 0 ? 0 : 1;
}
