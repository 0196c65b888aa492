/* The identity files of RESUMED, written under a scratch root (make -C guest/agent test). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "identity.h"
#include "check.h"

static char *slurp(const char *root, const char *name) {
  static char buf[4096];
  char path[512];
  snprintf(path, sizeof path, "%s%s", root, name);
  FILE *f = fopen(path, "r");
  if (!f) return NULL;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  return buf;
}

static void put(const char *root, const char *name, const char *text) {
  char path[512];
  snprintf(path, sizeof path, "%s%s", root, name);
  FILE *f = fopen(path, "w");
  fputs(text, f);
  fclose(f);
}

static long inode_of(const char *root, const char *name) {
  char path[512];
  struct stat st;
  snprintf(path, sizeof path, "%s%s", root, name);
  return stat(path, &st) == 0 ? (long)st.st_ino : -1;
}

int main(void) {
  CHECK(identity_valid_hostname("sbx-0123456789abcdef"));
  CHECK(identity_valid_hostname("a"));
  CHECK(!identity_valid_hostname(""));
  CHECK(!identity_valid_hostname("-a"));
  CHECK(!identity_valid_hostname("a-"));
  CHECK(!identity_valid_hostname("sbx_1"));
  CHECK(!identity_valid_hostname("Upper"));
  CHECK(!identity_valid_hostname("a.b"));
  CHECK(!identity_valid_hostname("0123456789012345678901234567890123456789012345678901234567890123"));
  CHECK(identity_valid_machine_id("0123456789abcdef0123456789abcdef"));
  CHECK(!identity_valid_machine_id("00000000000000000000000000000000"));
  CHECK(!identity_valid_machine_id("0123456789ABCDEF0123456789abcdef"));
  CHECK(!identity_valid_machine_id("0123456789abcdef0123456789abcde"));

  uint8_t mac[6] = {0x02, 0xaa, 0xbb, 0xcc, 0xdd, 0xee};
  CHECK(identity_valid_mac(mac));
  mac[0] = 0x03;
  CHECK(!identity_valid_mac(mac));
  memset(mac, 0, sizeof mac);
  CHECK(!identity_valid_mac(mac));

  size_t tl = 0;
  char *t = identity_hosts_text(NULL, 0, "sbx-1", &tl);
  CHECK(t && strcmp(t, "127.0.0.1\tlocalhost\n127.0.1.1\tsbx-1\n::1\tlocalhost ip6-localhost ip6-loopback\n") == 0);
  free(t);
  const char *debian = "127.0.0.1\tlocalhost\n127.0.1.1\ttorpor\n::1\tlocalhost\n";
  t = identity_hosts_text(debian, strlen(debian), "sbx-2", &tl);
  CHECK(t && strcmp(t, "127.0.0.1\tlocalhost\n127.0.1.1\tsbx-2\n::1\tlocalhost\n") == 0);
  free(t);
  const char *other = "# mine\n10.0.0.9 db\n  127.0.1.1 old.example old";
  t = identity_hosts_text(other, strlen(other), "sbx-3", &tl);
  CHECK(t && strcmp(t, "# mine\n10.0.0.9 db\n127.0.1.1\tsbx-3\n") == 0);
  free(t);
  const char *none = "127.0.0.1 localhost";
  t = identity_hosts_text(none, strlen(none), "sbx-4", &tl);
  CHECK(t && strcmp(t, "127.0.0.1 localhost\n127.0.1.1\tsbx-4\n") == 0);
  free(t);
  const char *lookalike = "127.0.1.10 x\n";
  t = identity_hosts_text(lookalike, strlen(lookalike), "sbx-5", &tl);
  CHECK(t && strcmp(t, "127.0.1.10 x\n127.0.1.1\tsbx-5\n") == 0);
  free(t);
  /* A NUL inside the file is carried through: every byte counted, none lost. */
  static const char nul[] = "10.0.0.1 a\n\0 junk\n10.0.0.2 b\n";
  t = identity_hosts_text(nul, sizeof nul - 1, "sbx-6", &tl);
  CHECK(t && tl == sizeof nul - 1 + strlen("127.0.1.1\tsbx-6\n") && memcmp(t, nul, sizeof nul - 1) == 0);
  free(t);

  char root[] = "/tmp/torpor-identity-XXXXXX";
  CHECK(mkdtemp(root) != NULL);
  char etc[600];
  snprintf(etc, sizeof etc, "%s/etc", root);
  mkdir(etc, 0755);
  char note[256];
  /* A root without any of the files (a container image): all three made. */
  CHECK(identity_write_files(root, "sbx-a", "0123456789abcdef0123456789abcdef", note, sizeof note) == 0);
  CHECK(note[0] == 0);
  CHECK(strcmp(slurp(root, "/etc/hostname"), "sbx-a\n") == 0);
  CHECK(strcmp(slurp(root, "/etc/machine-id"), "0123456789abcdef0123456789abcdef\n") == 0);
  CHECK(strstr(slurp(root, "/etc/hosts"), "127.0.1.1\tsbx-a\n") != NULL);
  /* Unchanged values leave the files as they are (same inode: no rename). */
  long before = inode_of(root, "/etc/hosts");
  CHECK(identity_write_files(root, "sbx-a", "0123456789abcdef0123456789abcdef", note, sizeof note) == 0);
  CHECK(inode_of(root, "/etc/hosts") == before);
  /* A user's own lines are kept. */
  put(root, "/etc/hosts", "10.1.1.1 mine\n127.0.1.1 sbx-a\n");
  CHECK(identity_write_files(root, "sbx-b", NULL, note, sizeof note) == 0);
  CHECK(strcmp(slurp(root, "/etc/hosts"), "10.1.1.1 mine\n127.0.1.1\tsbx-b\n") == 0);
  CHECK(strcmp(slurp(root, "/etc/machine-id"), "0123456789abcdef0123456789abcdef\n") == 0);

  /* Not the agent's to rewrite: an /etc/hosts of 256 KiB or more, a FIFO (never opened for
   * reading: the agent would block), a symlink. Each left as it is, the others still done. */
  char path[700];
  snprintf(path, sizeof path, "%s/etc/hosts", root);
  FILE *big = fopen(path, "w");
  for (int i = 0; i < 20000; i++) fprintf(big, "10.%d.%d.%d blocked-%d.example\n", i >> 16, (i >> 8) & 255, i & 255, i);
  fclose(big);
  long big_inode = inode_of(root, "/etc/hosts");
  CHECK(identity_write_files(root, "sbx-c", NULL, note, sizeof note) == 1);
  CHECK(strstr(note, "/etc/hosts left as it was") != NULL);
  CHECK(inode_of(root, "/etc/hosts") == big_inode);
  CHECK(strcmp(slurp(root, "/etc/hostname"), "sbx-c\n") == 0);
  unlink(path);
  CHECK(mkfifo(path, 0644) == 0);
  CHECK(identity_write_files(root, "sbx-d", NULL, note, sizeof note) == 1);
  struct stat st;
  CHECK(lstat(path, &st) == 0 && S_ISFIFO(st.st_mode));
  unlink(path);
  char target[700];
  snprintf(target, sizeof target, "%s/hosts-elsewhere", root);
  put(root, "/hosts-elsewhere", "10.9.9.9 kept\n");
  CHECK(symlink(target, path) == 0);
  CHECK(identity_write_files(root, "sbx-e", NULL, note, sizeof note) == 1);
  CHECK(strcmp(slurp(root, "/hosts-elsewhere"), "10.9.9.9 kept\n") == 0);
  /* No /etc at all: every file named, none made. */
  char missing[600];
  snprintf(missing, sizeof missing, "%s/nowhere", root);
  CHECK(identity_write_files(missing, "sbx-f", "0123456789abcdef0123456789abcdef", note, sizeof note) == 3);
  CHECK(strstr(note, "/etc/hostname left as it was") != NULL);

  char cmd[700];
  snprintf(cmd, sizeof cmd, "rm -rf %s", root);
  CHECK(system(cmd) == 0);
  if (failures) return 1;
  printf("identity_test: ok\n");
  return 0;
}
