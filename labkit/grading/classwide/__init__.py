"""The class as a whole: what graded results say once every unit has its row.

Reads the results (the plain data of every row, with the labs, configurations, policy and roster's
columns; none of it depends on when or where it ran); writes nothing. Gives the questions every
drawing asks (`results`), each test's failure rate per configuration, the score distribution, final
points per lab and section, the submissions whose code is the same or nearly, and the leaderboards.

Above running (the rows it reads) and the course's state (the policy that turns them into points);
below publishing, which draws what it gives.
"""
