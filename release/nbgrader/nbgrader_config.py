# nbgrader's configuration for the course's exercises: `coursekit release nbgrader DIR`
# writes it into the nbgrader course directory DIR (README, "Grading with nbgrader").
c = get_config()  # noqa: F821 (nbgrader defines it)

# A cell may run as long as in the course's own build and grading (nbgrader's default: 30 s).
c.Execute.timeout = 300
