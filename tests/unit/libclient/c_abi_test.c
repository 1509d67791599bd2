/* The C ABI from plain C11: gradlane.h compiles as C, the layouts match, and a full session
 * (connect, register, post, wait, close) works against a loopback server process.
 * Usage: c_abi_test SERVER_EXE */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "libclient/gradlane.h"

static int failures = 0;
#define CHECK(cond) \
  do { \
    if (!(cond)) { \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures; \
    } \
  } while (0)

_Static_assert(sizeof(gl_sqe) == 64, "sqe");
_Static_assert(sizeof(gl_cqe) == 64, "cqe");
_Static_assert(sizeof(gl_completion) == 40, "completion");

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  CHECK(strcmp(gl_strerror(GL_OK), "ok") == 0);
  CHECK(strstr(gl_strerror(GL_E_BAD_VERSION), "version") != NULL);

  gl_connect_options o;
  memset(&o, 0, sizeof(o));
  o.socket_path = "/tmp/gradlane-c-abi-no-such/sock";
  gl_client* c = NULL;
  CHECK(gl_connect(&o, &c) == GL_E_DISCONNECTED);
  CHECK(c == NULL && strlen(gl_last_error(NULL)) > 0);

  char dir[] = "/tmp/gradlane-c-XXXXXX";
  if (mkdtemp(dir) == NULL) return 3;
  char sock[128];
  snprintf(sock, sizeof(sock), "%s/gradlaned.sock", dir);
  int to_server[2], from_server[2];
  if (pipe(to_server) != 0 || pipe(from_server) != 0) return 3;
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(to_server[0], 0);
    dup2(from_server[1], 1);
    close(to_server[1]);
    close(from_server[0]);
    execl(argv[1], argv[1], sock, (char*)NULL);
    _exit(127);
  }
  close(to_server[0]);
  close(from_server[1]);
  char ready[16] = {0};
  if (read(from_server[0], ready, sizeof(ready) - 1) <= 0 || strncmp(ready, "ready", 5) != 0) {
    fprintf(stderr, "server did not start\n");
    return 4;
  }

  o.socket_path = sock;
  o.ring_slots = 32;
  CHECK(gl_connect(&o, &c) == GL_OK);
  if (c != NULL) {
    const char* peers[] = {"h0:1", "h1:1"};
    gl_job_info job = {"c-job", 1, 2, peers, 2, "p3", "token"};
    CHECK(gl_register_job_mode(c, &job, 7) == GL_E_INVALID_ARGUMENT); /* unknown mode */
    CHECK(gl_register_job_mode(c, &job, GL_MODE_PS) == GL_OK);
    uint32_t id = 7;
    void* buf = NULL;
    CHECK(gl_register_tensor(c, "c.weight", 1024, GL_DTYPE_F16, 0, &id, &buf) == GL_OK);
    CHECK(id == 0 && buf != NULL);
    if (buf != NULL) memset(buf, 0x3c, 1024);
    CHECK(gl_post(c, id, 0, 0, GL_WHOLE_TENSOR, 42) == GL_OK);
    CHECK(gl_post(c, id, 0, 1, 2, 43) == GL_OK); /* odd offset: not whole f16 */
    gl_completion out[4];
    uint32_t got = 0, n = 0;
    while (got < 2 && gl_wait(c, out + got, 4 - got, &n, 2000) == GL_OK) got += n;
    CHECK(got == 2);
    CHECK(out[0].status == GL_OK && out[0].user_data == 42 && out[0].length == 1024);
    CHECK(out[1].status == GL_E_BAD_RANGE && out[1].user_data == 43);
    CHECK(gl_wait(c, out, 4, &n, 10) == GL_E_TIMEOUT);
    gl_close(c);
  }
  close(to_server[1]); /* EOF on the server's stdin: it exits */
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  rmdir(dir);
  if (failures == 0) printf("C ABI: ok\n");
  return failures == 0 ? 0 : 1;
}
