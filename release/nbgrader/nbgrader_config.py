# nbgrader's configuration for the course's exercises: `coursekit release nbgrader DIR`
# writes it into the nbgrader course directory DIR (README, "Grading with nbgrader").
c = get_config()  # noqa: F821 (nbgrader defines it)

# A cell may run as long as in the course's own build and grading (nbgrader's default: 30 s).
c.Execute.timeout = 300

# After a cell's reply, nbgrader waits iopub_timeout seconds for the rest of its output and
# then fails the whole submission (it raises on that timeout). 4 s by default: a class graded
# on a loaded server (or CI's 2 CPUs, with the course's own grader beside it) can pass that
# and lose a student's notebook. A minute still ends a kernel flooding its output.
c.Execute.iopub_timeout = 60
